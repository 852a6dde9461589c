"""The DFlash drafter network and the seam its kinds plug into (docs/spec.md section 1).
No training code lives here.

This file imports nothing from the ``dflash_train`` package on purpose: ``export``
copies it verbatim into the serving folder as the modeling file (followed by the file of
the exported drafter's kind, ``models/kinds/<kind>.py``), so the model that was trained and
the model that ``AutoModel.from_pretrained(..., trust_remote_code=True)`` builds are the same
source. It reads its shape from any object with the config attributes (our ``DrafterConfig``
or a Hugging Face ``PretrainedConfig``).

**Kinds.** DFlash is the backbone below. A kind (DFlash2, ...) is a
:class:`DrafterKind` registered by name (:func:`register_kind`) in its own file: what it adds
to each decoder layer (a module around the attention or the MLP sublayer), the heads it adds
to the drafter, how it drafts a block greedily from the drafter's states, and its serving
architecture and config keys. Nothing here branches on a kind's name; the drafter asks its
kind (:func:`kind_of`) for its parts.

Shapes used below: ``b`` batch, ``s`` context length (target positions), ``q`` block
positions (num_blocks * block_size), ``h`` hidden size, ``n`` number of target features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:  # flex_attention is optional: the dense path serves CPUs and older devices.
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover
    BlockMask, flex_attention = None, None

SLIDING_ATTENTION = "sliding_attention"


def _cfg(config, name, default=None):
    """Read a field from a dataclass config (its own fields, then its kind's ``options``) or a HF
    config (top-level keys, then the nested ``dflash_config``)."""
    value = getattr(config, name, None)
    for nested in ("options", "dflash_config"):
        if value is None:
            value = (getattr(config, nested, None) or {}).get(name)
    return default if value is None else value


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32 (as Qwen3/Llama do)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of the target's rotary embedding (theta and scaling).

    Plain RoPE is computed here; scaled variants (linear, llama3, yarn, ...) are
    delegated to transformers' own implementation so they match the target exactly.
    """
    head_dim = _cfg(config, "head_dim")
    theta = float(_cfg(config, "rope_theta", None) or (_cfg(config, "rope_parameters", {}) or {}).get("rope_theta", 10000.0))
    scaling = _cfg(config, "rope_scaling", None)
    if scaling is None:
        params = _cfg(config, "rope_parameters", None) or {}
        if params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if not scaling or scaling.get("rope_type", scaling.get("type", "default")) == "default":
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (theta**exponent), 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = scaling.get("rope_type", scaling.get("type"))
    hf = Qwen3Config(
        hidden_size=_cfg(config, "hidden_size"),
        num_attention_heads=_cfg(config, "num_attention_heads"),
        head_dim=head_dim,
        max_position_embeddings=_cfg(config, "max_position_embeddings", 32768),
        rope_parameters={**scaling, "rope_type": rope_type, "rope_theta": theta},
    )
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    return inv_freq.float(), float(attention_scaling)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for arbitrary integer positions."""

    def __init__(self, config):
        super().__init__()
        with torch.device("cpu"):  # from_pretrained builds modules on the meta device
            inv_freq, self.attention_scaling = rope_inv_freq(config)
        self._inv_freq_fp32 = inv_freq
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)

    def _apply(self, fn, recurse=True):
        """Moves follow the module; dtype casts (``.to(bfloat16)``) must not round the
        frequencies, which would shift the angles of long positions."""
        super()._apply(fn, recurse)
        if self.inv_freq.device.type != "meta":
            self.inv_freq = self._inv_freq_fp32.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)  # [b, 1, len, d] broadcast over heads


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float) -> torch.Tensor:
    """Non-causal attention of ``q`` [b, hq, q, d] over ``k``/``v`` [b, hkv, kv, d].

    ``mask`` is a flex ``BlockMask`` (block-sparse GPU path), a dense bool tensor
    [b, 1, q, kv] (True = visible; rows with no visible key output zeros, matching
    flex's semantics), or ``None`` (everything visible: inference without padding).
    """
    if BlockMask is not None and isinstance(mask, BlockMask):
        return _compiled_flex()(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    row_visible = mask.any(dim=-1, keepdim=True)
    safe_mask = mask | ~row_visible  # a fully masked row would give NaN (and NaN gradients)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out * row_visible.to(out.dtype)


_FLEX = None


def _compiled_flex():
    """flex_attention compiled exactly once per process (static shapes, no recompiles)."""
    global _FLEX
    if _FLEX is None:
        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


class DFlashAttention(nn.Module):
    """Block queries attend to [context features ; block] through shared K/V projections."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden = _cfg(config, "hidden_size")
        self.head_dim = _cfg(config, "head_dim")
        self.num_heads = _cfg(config, "num_attention_heads")
        self.num_kv_heads = _cfg(config, "num_key_value_heads")
        bias = bool(_cfg(config, "attention_bias", False))
        eps = _cfg(config, "rms_norm_eps")
        self.scale = self.head_dim**-0.5
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)
        self.layer_idx = layer_idx

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)

    def context_kv(self, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K/V of the context features alone (what an inference cache stores)."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(context), self.num_kv_heads)), cos, sin)
        v = self._heads(self.v_proj(context), self.num_kv_heads)
        return k, v

    def forward(self, hidden, context, q_rope, ctx_rope, mask, cache=None):
        """``hidden`` [b, q, h] block states; ``context`` [b, s, h] normed context features.

        ``cache`` (inference only) holds this layer's context K/V already computed for
        earlier positions; the new context K/V are appended to it.
        """
        q = apply_rope(self.q_norm(self._heads(self.q_proj(hidden), self.num_heads)), *q_rope)
        k_ctx, v_ctx = self.context_kv(context, *ctx_rope)
        if cache is not None:
            k_ctx, v_ctx = cache.extend(self.layer_idx, k_ctx, v_ctx)
        k_blk = apply_rope(self.k_norm(self._heads(self.k_proj(hidden), self.num_kv_heads)), *q_rope)
        v_blk = self._heads(self.v_proj(hidden), self.num_kv_heads)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        out = attend(q, k, v, mask, self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(*hidden.shape[:2], -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class KindModule(nn.Module):
    """A module a kind adds (a sublayer wrapper or a head). It starts from its own
    ``reset_parameters`` (identity-like, so an untrained kind computes what DFlash computes),
    which the exported wrapper's fresh-model init calls too."""

    def reset_parameters(self) -> None:  # pragma: no cover - every kind module defines its own
        raise NotImplementedError


class DrafterKind:
    """The network side of a drafter kind: what it adds to the DFlash backbone.

    ``options``: the kind's settings and their defaults (``drafter.options`` in a job config, the
    serving config's keys in an export). The base class is DFlash itself: nothing added.
    """

    name = "dflash"
    architecture = "DFlashDraftModel"  # the serving config's ``architectures`` entry
    options: dict = {}

    def option(self, config, name: str):
        """``name`` from ``config`` (:func:`_cfg`), else the kind's default."""
        return _cfg(config, name, self.options[name])

    def around_attention(self, config) -> tuple[str, KindModule] | None:
        """(attribute name, module) wrapped around every layer's attention sublayer, or None.
        The module has ``prepare(x, segment) -> (x, state)`` for the sublayer's normed input and
        ``finish(y, state, segment) -> y`` for its output, ``segment`` the slots per block."""
        return None

    def around_mlp(self, config) -> tuple[str, KindModule] | None:
        """As :meth:`around_attention`, for the MLP sublayer."""
        return None

    def heads(self, config) -> dict[str, KindModule]:
        """Modules added to the drafter under these attribute names (their tensors ship with it)."""
        return {}

    def greedy_draft(self, drafter, hidden, logits, anchor_ids):
        """The block's greedy drafts [b, P] from its draft slots' final states ``hidden`` [b, P, h],
        their ``logits`` [b, P, vocab] and ``anchor_ids`` [b]: DFlash takes every slot's argmax."""
        return logits.argmax(-1)

    def serving_fields(self, config) -> dict:
        """Keys of the kind's serving config: ``{"dflash_config": {...}}`` entries and top-level keys."""
        return {}

    def options_from_serving(self, config) -> dict:
        """The kind's options read back from a serving config (a dict): each at the top level or in
        ``dflash_config``; a ``ValueError`` listing the missing ones."""
        nested = config.get("dflash_config") or {}
        found = {k: config.get(k, nested.get(k)) for k in self.options}
        missing = [k for k, v in found.items() if v is None]
        if missing:
            raise ValueError(f"missing required field(s) {[f'dflash_config.{k}' for k in missing]} of a "
                             f"{self.architecture}")
        return found

    def check_options(self, options: dict, config) -> None:
        """Raise ``ValueError`` naming ``drafter.options.<key>`` for an unknown or impossible option."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise ValueError(f"drafter.options: {unknown} are not options of drafter.kind={self.name} (its options: {known})")


KINDS: dict[str, DrafterKind] = {}


def register_kind(kind: DrafterKind) -> DrafterKind:
    """Make ``kind`` known by its name and its serving architecture."""
    KINDS[kind.name] = kind
    return kind


register_kind(DrafterKind())


# the files of an exported (serving) drafter folder, as Hugging Face names them
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
class _ServingKeys:
    """A serving config dict seen as the object with attributes that ``kind_of`` reads."""

    def __init__(self, config):
        self.architectures = config.get("architectures")
        self.kind = None


def serving_kind(config) -> DrafterKind:
    """The kind of a serving ``config.json`` dict, by its ``architectures`` (its ``kind`` key, if any,
    is not read)."""
    return kind_of(_ServingKeys(config))


def kind_of(config) -> DrafterKind:
    """The kind a config describes: our ``kind`` field, else a serving config's ``architectures``."""
    name = _cfg(config, "kind", None)
    if name is None:
        names = list(getattr(config, "architectures", None) or [])
        name = next((k.name for k in KINDS.values() if k.architecture in names), "dflash")
    if name not in KINDS:
        raise ValueError(f"unknown drafter kind {name!r}; known: {sorted(KINDS)}")
    return KINDS[name]

class DFlashDecoderLayer(nn.Module):
    """Qwen3-style pre-norm block whose attention also sees the context features.

    A kind may wrap a module around either sublayer (DFlash2: ``attention_conv``, ``mlp_conv``):
    ``prepare`` on the sublayer's normed input, ``finish`` on its output, before the residual add.
    """

    def __init__(self, config, layer_idx: int, kind: DrafterKind | None = None):
        super().__init__()
        kind = kind or kind_of(config)
        hidden, eps = _cfg(config, "hidden_size"), _cfg(config, "rms_norm_eps")
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = SwiGLU(hidden, _cfg(config, "intermediate_size"))
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self._wrappers = {}
        for role, wrapper in (("attention", kind.around_attention(config)), ("mlp", kind.around_mlp(config))):
            if wrapper is not None:
                self.add_module(*wrapper)
                self._wrappers[role] = wrapper[0]

    @property
    def wraps(self) -> bool:
        """Whether a kind module wraps a sublayer (it then needs the slots per block)."""
        return bool(self._wrappers)

    def _around(self, role, sublayer, x, segment):
        name = self._wrappers.get(role)
        if name is None:
            return sublayer(x)
        wrapper = getattr(self, name)
        x, state = wrapper.prepare(x, segment)
        return wrapper.finish(sublayer(x), state, segment)

    def forward(self, hidden, context, q_rope, ctx_rope, mask, cache=None, segment=None):
        """``segment``: slots per block (a kind's sublayer wrappers stay inside a block)."""
        def attn(x):
            return self.self_attn(x, context, q_rope, ctx_rope, mask, cache)

        hidden = hidden + self._around("attention", attn, self.input_layernorm(hidden), segment)
        return hidden + self._around("mlp", self.mlp, self.post_attention_layernorm(hidden), segment)


class DFlashDrafter(nn.Module):
    """N decoder layers + ``fc``/``hidden_norm`` over target features + final ``norm``, plus what
    the config's kind (:func:`kind_of`, ``self.kind``) adds: modules around each layer's sublayers
    and heads (``self.head_names``; DFlash2's ``candidate_selector``).

    The target's embedding and lm_head are not part of this module: the caller embeds
    the block tokens and applies the frozen lm_head to the returned hidden states.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        hidden = _cfg(config, "hidden_size")
        num_layers = _cfg(config, "num_hidden_layers")
        num_features = len(_cfg(config, "target_layer_ids"))
        eps = _cfg(config, "rms_norm_eps")
        self.block_size = _cfg(config, "block_size")
        self.layer_types = list(_cfg(config, "layer_types", None) or ["full_attention"] * num_layers)
        self.sliding_window = _cfg(config, "sliding_window", None)
        self.kind = kind_of(config)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i, self.kind) for i in range(num_layers))
        self.norm = RMSNorm(hidden, eps)
        self.fc = nn.Linear(num_features * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.head_names = []
        for name, head in self.kind.heads(config).items():
            self.add_module(name, head)
            self.head_names.append(name)
        self.uses_segments = any(layer.wraps for layer in self.layers)

    def conv_segment(self, num_slots: int) -> int:
        """Slots per segment of a kind's sublayer wrappers: whole blocks, or one shorter final block (inference)."""
        if num_slots % self.block_size == 0:
            return self.block_size
        if num_slots < self.block_size:
            return num_slots
        raise ValueError(f"{num_slots} block slots are neither whole blocks of {self.block_size} nor one shorter block")

    def project_context(self, target_features: torch.Tensor) -> torch.Tensor:
        """[b, s, n*h] concatenated target hidden states -> [b, s, h] context (once per forward)."""
        return self.hidden_norm(self.fc(target_features))

    def forward(
        self,
        block_embeds: torch.Tensor,
        target_features: torch.Tensor,
        block_positions: torch.Tensor,
        context_positions: torch.Tensor,
        masks=None,
        cache=None,
    ) -> torch.Tensor:
        """Return the final-normed hidden states of every block position.

        ``block_embeds`` [b, q, h]: target embeddings of [anchor, MASK, ...] per block.
        ``target_features`` [b, s, n*h]; positions are absolute token positions.
        ``masks``: one mask per layer type ({"full_attention": m, "sliding_attention": m})
        or a single mask used by every layer; built once per batch by the caller.
        """
        context = self.project_context(target_features)
        q_rope = self.rotary_emb(block_positions, block_embeds.dtype)
        ctx_rope = self.rotary_emb(context_positions, block_embeds.dtype)
        hidden = block_embeds
        segment = self.conv_segment(hidden.shape[1]) if self.uses_segments else None
        for layer, layer_type in zip(self.layers, self.layer_types):
            mask = masks.get(layer_type) if isinstance(masks, dict) else masks
            hidden = layer(hidden, context, q_rope, ctx_rope, mask, cache, segment)
        return self.norm(hidden)
