"""The DFlash and DFlash2 drafter networks (docs/spec.md section 1). No training code lives here.

This file imports nothing from the ``dflash_train`` package on purpose: ``export``
copies it verbatim into the serving folder as the modeling file, so the model that
was trained and the model that ``AutoModel.from_pretrained(..., trust_remote_code=True)``
builds are the same source. It reads its shape from any object with the config
attributes (our ``DrafterConfig`` or a Hugging Face ``PretrainedConfig``).

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
    """Read a field from a dataclass config or a HF config (which may nest dflash fields)."""
    value = getattr(config, name, None)
    if value is None:
        value = (getattr(config, "dflash_config", None) or {}).get(name, default)
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


def is_dflash2(config) -> bool:
    """DFlash2 (dynamic convolutions + candidate selector): our ``kind: dflash2``, or a serving
    config whose ``dflash_config`` carries ``conv_kernel_size`` (``DFlash2DraftModel``)."""
    kind = _cfg(config, "kind", None)
    if kind is not None:
        return kind == "dflash2"
    return _cfg(config, "conv_kernel_size", None) is not None


def grouped_causal_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, segment: int) -> torch.Tensor:
    """``y[t] = sum_o (base[o] + delta[t, o, group]) * x[t - o]``, inside segments of ``segment`` slots.

    ``x`` [b, q, h]; ``delta`` [b, q, K, g] (one dynamic coefficient per tap and group of
    h/g channels, computed from the token at t); ``base`` [K, h] static taps. The q slots are
    q/segment independent blocks: a tap never reads across a block boundary, so slot 0 of
    every block reads zeros for o >= 1 (each block is drafted on its own at inference, where
    nothing precedes its anchor slot). With base = [1, 0, ...] and delta = 0 this is exactly
    the identity, which is why an untrained DFlash2 equals DFlash.
    """
    b, q, h = x.shape
    taps, groups = delta.shape[-2], delta.shape[-1]
    blocks = x.view(b, q // segment, segment, groups, h // groups)
    delta = delta.view(b, q // segment, segment, taps, groups, 1)
    out = torch.zeros_like(blocks)
    for o in range(taps):
        shifted = blocks if o == 0 else F.pad(blocks[:, :, :-o], (0, 0, 0, 0, o, 0))
        out = out + base[o].view(groups, h // groups).to(x.dtype) * shifted
        out = torch.addcmul(out, delta[:, :, :, o], shifted)
    return out.view(b, q, h)


class GroupedDynamicCausalConv(nn.Module):
    """Two causal convolutions around one sublayer: ``prepare`` on its normed input, ``finish`` on
    its output (before the residual add). Both dynamic parts come from the sublayer's input.

    ``base_kernel`` [2, K, h] (prepare, finish); ``kernel_projection`` h -> 2 * K * groups, the
    authors' names and shapes. Identity at initialization: tap 0 = 1, the others 0, projection 0.
    """

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.groups = kernel_size, hidden // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor, segment: int) -> tuple[torch.Tensor, torch.Tensor]:
        delta = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return grouped_causal_conv(x, delta[..., 0, :, :], self.base_kernel[0], segment), delta[..., 1, :, :]

    def finish(self, x: torch.Tensor, delta: torch.Tensor, segment: int) -> torch.Tensor:
        return grouped_causal_conv(x, delta, self.base_kernel[1], segment)


class CandidateSelector(nn.Module):
    """Scores a slot's top-k candidates given the token before it:
    ``S(a, b) = U(b) + <A[a] * P h, B[b]>`` with U the drafter's logit of b, A/B rank-r
    codebooks (``predecessor_codebook``/``successor_codebook``), P ``hidden_projection``.
    B starts at zero, so an untrained selector ranks by the logits alone (DFlash's argmax)."""

    def __init__(self, config):
        super().__init__()
        rank, vocab = int(_cfg(config, "selector_rank")), _cfg(config, "vocab_size")
        self.top_k = int(_cfg(config, "selector_top_k"))
        # Plain [vocab, r] parameters, not nn.Embedding: the served tensors are named
        # ``candidate_selector.{predecessor,successor}_codebook`` with no ``.weight`` (the authors').
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.hidden_projection = nn.Linear(_cfg(config, "hidden_size"), rank, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            nn.init.normal_(self.predecessor_codebook, std=1.0)
            self.successor_codebook.zero_()

    def scores(self, projected, unary, candidates, predecessors) -> torch.Tensor:
        """``projected`` [..., r] = P h, ``unary``/``candidates`` [..., k], ``predecessors`` [...]: S [..., k]."""
        pair = F.embedding(predecessors, self.predecessor_codebook) * projected
        succ = F.embedding(candidates, self.successor_codebook)
        return unary + (succ * pair.unsqueeze(-2).to(succ.dtype)).sum(-1).to(unary.dtype)


def selector_transitions(selector: CandidateSelector, hidden, logits, anchor_ids):
    """Every score the walk can visit, in one batched product instead of one small product per slot.

    Slot j's predecessor is one of slot j - 1's k candidates (slot 0's is the anchor), so the
    walk only ever reads ``T[:, j, a, c]`` = S(candidate a of slot j - 1 -> candidate c of slot j):
    k x k scores per slot, [b, P, k, k] in all (15 x 16 x 16 for B = 16). Computing them up front
    leaves the walk itself a chain of tiny index lookups instead of each slot's own gathers and
    products: the recipe-shaped draft step replayed in its CUDA graph on an H200 went from 0.764 to
    0.691 ms (DFlash's: 0.535; docs/results/dflash2-h200/draft-step). The product is a matmul over
    the rank rather than ``CandidateSelector.scores``' broadcast sum, which for all k predecessors
    would materialize [b, P, k, k, r]: the same S up to rounding (tests: the slow-loop walks).
    Slot 0's k rows are all the anchor's. Returns ``(T float32, candidates [b, P, k])``."""
    unary, candidates = torch.topk(logits.float(), selector.top_k, dim=-1)
    projected = selector.hidden_projection(hidden)  # [b, P, r]
    anchors = anchor_ids.reshape(-1, 1, 1).expand(-1, 1, selector.top_k)
    before = torch.cat([anchors, candidates[:, :-1]], dim=1)  # [b, P, k]: each slot's possible predecessors
    pair = F.embedding(before, selector.predecessor_codebook) * projected.unsqueeze(-2)  # [b, P, k, r]
    succ = F.embedding(candidates, selector.successor_codebook)  # [b, P, k, r]
    pairwise = pair.to(succ.dtype) @ succ.transpose(-1, -2)  # [b, P, k (before), k (candidate)]
    return unary.unsqueeze(-2) + pairwise.float(), candidates


def selector_walk(selector: CandidateSelector, hidden, logits, anchor_ids, temperature: float = 0.0, generator=None):
    """The DFlash2 draft path: a sequential walk over each slot's top-k candidates.

    ``hidden`` [b, P, h] final-normed states of the P draft slots (the anchor slot excluded),
    ``logits`` [b, P, vocab] their logits, ``anchor_ids`` [b] the verified token before slot 1.
    Slot j's predecessor is the token the walk chose at slot j - 1. Greedy (temperature 0)
    takes argmax S; otherwise a draw from softmax(S / T), whose row q (over the k candidates)
    the rejection sampler needs. Returns ``(path [b, P], candidates [b, P, k], q [b, P, k] or None)``.
    The scores come from :func:`selector_transitions`; greedy then needs only each (slot,
    predecessor)'s best successor and P lookups along the chain.
    """
    scores, candidates = selector_transitions(selector, hidden, logits, anchor_ids)
    rows, slots, k = scores.shape[0], scores.shape[1], scores.shape[-1]
    if temperature > 0:
        index, picks, q_rows = torch.zeros(rows, dtype=torch.long, device=scores.device), [], []
        for slot in range(slots):
            s = scores[:, slot].gather(1, index.view(-1, 1, 1).expand(-1, 1, k))[:, 0]  # the row after the pick
            q = torch.softmax(s / temperature, dim=-1)
            index = torch.multinomial(q, 1, generator=generator)[:, 0]
            picks.append(index)
            q_rows.append(q)
        q_out = torch.stack(q_rows, dim=1)
    else:
        best_next = scores.argmax(dim=-1)  # [b, P, k]: the best candidate after each possible predecessor
        picks = [best_next[:, 0, 0]]
        for slot in range(1, slots):
            picks.append(best_next[:, slot].gather(-1, picks[-1][:, None])[:, 0])
        q_out = None
    path = candidates.gather(-1, torch.stack(picks, dim=1).unsqueeze(-1))[..., 0]
    return path, candidates, q_out


class DFlashDecoderLayer(nn.Module):
    """Qwen3-style pre-norm block whose attention also sees the context features.

    DFlash2 adds ``attention_conv``/``mlp_conv`` (None for DFlash) around each sublayer.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden, eps = _cfg(config, "hidden_size"), _cfg(config, "rms_norm_eps")
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = SwiGLU(hidden, _cfg(config, "intermediate_size"))
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.attention_conv = self.mlp_conv = None
        if is_dflash2(config):
            kernel, group = int(_cfg(config, "conv_kernel_size")), int(_cfg(config, "conv_group_size"))
            self.attention_conv = GroupedDynamicCausalConv(hidden, kernel, group)
            self.mlp_conv = GroupedDynamicCausalConv(hidden, kernel, group)

    @staticmethod
    def _around(conv, sublayer, x, segment):
        if conv is None:
            return sublayer(x)
        x, delta = conv.prepare(x, segment)
        return conv.finish(sublayer(x), delta, segment)

    def forward(self, hidden, context, q_rope, ctx_rope, mask, cache=None, segment=None):
        """``segment``: slots per block (DFlash2's convolutions stay inside a block)."""
        def attn(x):
            return self.self_attn(x, context, q_rope, ctx_rope, mask, cache)

        hidden = hidden + self._around(self.attention_conv, attn, self.input_layernorm(hidden), segment)
        return hidden + self._around(self.mlp_conv, self.mlp, self.post_attention_layernorm(hidden), segment)


class DFlashDrafter(nn.Module):
    """N decoder layers + ``fc``/``hidden_norm`` over target features + final ``norm``.

    A DFlash2 config (``is_dflash2``) adds each layer's two convolutions and the
    ``candidate_selector``; decoding then walks the candidates (``selector_walk``).

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
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(num_layers))
        self.norm = RMSNorm(hidden, eps)
        self.fc = nn.Linear(num_features * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.candidate_selector = CandidateSelector(config) if is_dflash2(config) else None

    def conv_segment(self, num_slots: int) -> int:
        """Slots per convolution segment: whole blocks, or one shorter final block (inference)."""
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
        segment = self.conv_segment(hidden.shape[1]) if self.candidate_selector is not None else None
        for layer, layer_type in zip(self.layers, self.layer_types):
            mask = masks.get(layer_type) if isinstance(masks, dict) else masks
            hidden = layer(hidden, context, q_rope, ctx_rope, mask, cache, segment)
        return self.norm(hidden)
