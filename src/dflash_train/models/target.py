"""The frozen target model: context features, embedding and lm_head handles.

Any ``AutoModelForCausalLM`` works (a local folder, or a GGUF file through
transformers' ``gguf_file``). Context features are captured with forward hooks on
the decoder layers (the raw output of layer ``i`` == HF ``hidden_states[i + 1]``),
and for training the layer list is cut after the deepest needed layer, so the
target never runs layers whose output nobody reads.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch import nn

from dflash_train.models.attention import document_layout
from dflash_train.models.config import TargetFacts


def _decoder_layers(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the decoder layer list, and the attribute name."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for name in ("layers", "h", "blocks"):
        if isinstance(getattr(base, name, None), nn.ModuleList):
            return base, name
    raise ValueError(f"cannot find the decoder layer list of {type(model).__name__}")


def target_facts(hf_config) -> TargetFacts:
    """Read the drafter-relevant numbers from a HF config (text part for multimodal ones)."""
    cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    heads = cfg.num_attention_heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if scaling.get("rope_type", "default") == "default":
        scaling = None
    return TargetFacts(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        intermediate_size=cfg.intermediate_size,
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_position_embeddings=getattr(cfg, "max_position_embeddings", 32768),
        vocab_size=cfg.vocab_size,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        **moe_widths(cfg),
    )


def moe_widths(cfg) -> dict:
    """A mixture-of-experts config's per-token MLP width and router width (``TargetFacts``), or
    nothing for a dense one. The names differ by family: Qwen2/3-MoE give the expert width as
    ``moe_intermediate_size`` (their ``intermediate_size`` is a dense layer's, unused when every layer
    is sparse) and Qwen2-MoE adds a shared expert; Mixtral's ``intermediate_size`` IS the expert's
    width (top-2 of 8: a token passes through twice that width, not once)."""
    top_k = getattr(cfg, "num_experts_per_tok", None)
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not top_k or not experts:
        return {}
    expert = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    shared = getattr(cfg, "shared_expert_intermediate_size", None) or 0
    return {"active_mlp_width": top_k * expert + shared, "router_experts": experts}


def choose_mask_token_id(tokenizer, vocab_size: int) -> tuple[int, str]:
    """Pick a token id whose embedding row exists but that real text never uses.

    Preference: an unused padded row past the tokenizer (Qwen3: 151669); else a
    reserved/unused special token; else a special token that the chat template,
    bos/eos/pad/unk never use. Returns (id, reason).
    """
    if tokenizer is None:
        return vocab_size - 1, "no tokenizer: the last embedding row"
    n_tokens = len(tokenizer)
    if vocab_size > n_tokens:
        return n_tokens, f"the first unused padded embedding row ({n_tokens} of {vocab_size})"
    special = sorted(set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {})))
    special = [(idx, tokenizer.convert_ids_to_tokens(idx)) for idx in special if idx < vocab_size]
    for idx, token in special:
        if "reserved" in token.lower():
            return idx, f"reserved special token {token!r}"
    template = str(getattr(tokenizer, "chat_template", "") or "")
    busy = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    for idx, token in special:
        if idx not in busy and token not in template:
            return idx, f"special token {token!r} unused by the chat template"
    raise ValueError("could not choose a mask token automatically; set drafter.mask_token_id")


class Target(nn.Module):
    """A frozen HF causal LM seen through the three things a drafter needs."""

    def __init__(self, model: nn.Module, tokenizer=None):
        super().__init__()
        model.eval().requires_grad_(False)
        _no_router_outputs(model)
        self.model = model
        self.tokenizer = tokenizer
        self.facts = target_facts(model.config)
        self._layer_owner, self._layer_attr = _decoder_layers(model)
        self.num_layers = len(self.layers)  # the whole target's (``load_head`` loads none of them)

    @classmethod
    def load(cls, path: str | os.PathLike, dtype=torch.float32, device="cpu", gguf_file: str | None = None,
             fp8_linear: bool = False) -> Target:
        """Load a target from a local folder or ``folder/file.gguf`` (frozen, eval mode).

        ``fp8_linear`` (``target.fp8_linear``): its decoder layers' linear layers become FP8
        matmuls once it is on ``device`` (``models/fp8.py``; a ``ValueError`` where the device
        has no FP8 tensor cores)."""
        from transformers import AutoModelForCausalLM

        path, kwargs = _target_location(path, gguf_file)
        tokenizer = load_tokenizer(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).to(device)
        target = cls(model, tokenizer)
        if fp8_linear:
            target.use_fp8_linears()
        return target

    @classmethod
    def load_head(cls, path: str | os.PathLike, dtype=torch.float32, device="cpu", gguf_file: str | None = None) -> Target:
        """The target without its decoder layers: embedding, final norm and lm_head, all a drafter
        trained from a feature store reads (``features/reader.py``). The config is loaded with
        ``num_hidden_layers=0`` so ``from_pretrained`` reads none of the layers' weights (an 8B
        target: 1.2 of 16 GB); ``facts`` (and ``num_layers``) keep the whole target's numbers, so the
        drafter is the one a full load gives. ``features`` refuses such a target."""
        import copy

        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        path, kwargs = _target_location(path, gguf_file)
        tokenizer = load_tokenizer(path, **kwargs)
        full = AutoConfig.from_pretrained(path, **kwargs)
        headless = copy.deepcopy(full)
        text = headless.get_text_config() if hasattr(headless, "get_text_config") else headless
        text.num_hidden_layers = 0
        if isinstance(getattr(text, "layer_types", None), list):
            text.layer_types = []
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the skipped layers' weights would be listed as unexpected
        try:
            model = AutoModelForCausalLM.from_pretrained(path, config=headless, dtype=dtype, **kwargs).to(device)
        finally:
            hf_logging.set_verbosity(verbosity)
        target = cls(model, tokenizer)
        target.facts, target.num_layers = target_facts(full), target_facts(full).num_hidden_layers
        return target

    def use_fp8_linears(self, emulate: bool = False) -> list[str]:
        """Replace the linear layers of the decoder layers by FP8 ones (``models/fp8.convert_linears``;
        the embedding and lm_head are not in the decoder layers). Returns the replaced names.
        ``emulate``: the float32 emulation where FP8 matmuls are missing (tests, the CPU bench)."""
        from dflash_train.models.fp8 import convert_linears

        return convert_linears(self.layers, emulate=emulate)

    # -- handles ---------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        return getattr(self._layer_owner, self._layer_attr)

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @property
    def final_norm(self) -> nn.Module | None:
        """The norm after the last decoder layer (Llama/Qwen ``model.norm``), or None if not found."""
        for name in ("norm", "final_layernorm", "ln_f"):
            module = getattr(self._layer_owner, name, None)
            if isinstance(module, nn.Module):
                return module
        return None

    @property
    def device(self) -> torch.device:
        return self.lm_head_weight.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    # -- features --------------------------------------------------------------------------
    def validate_layer_ids(self, layer_ids: list[int]) -> None:
        n = self.num_layers
        bad = [i for i in layer_ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"target_layer_ids {bad} out of range: the target has {n} layers (0..{n - 1})")

    @contextlib.contextmanager
    def _capture(self, layer_ids: list[int], truncate: bool):
        """Hook the wanted layers; optionally cut the layer list after the deepest one."""
        captured: dict[int, torch.Tensor] = {}
        handles = []
        for i in layer_ids:
            def hook(_module, _args, output, i=i):
                captured[i] = output[0] if isinstance(output, tuple) else output
            handles.append(self.layers[i].register_forward_hook(hook))
        full = self.layers
        if truncate:
            setattr(self._layer_owner, self._layer_attr, nn.ModuleList(list(full)[: max(layer_ids) + 1]))
        try:
            yield captured
        finally:
            setattr(self._layer_owner, self._layer_attr, full)
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, layer_ids: list[int],
                 doc_ids: torch.Tensor | None = None, final_hidden: bool = False):
        """[b, s, n*h]: the raw outputs of ``layer_ids`` concatenated on the last axis.

        Runs only up to the deepest needed layer (the final norm then sees a
        mid-network state, but nobody reads it). ``doc_ids`` [b, s] (packed rows: each
        token's conversation) makes every conversation see only itself, at positions
        restarting from 0, so its features equal those of a row of its own.
        ``final_hidden`` (distillation): run every layer and the final norm, and return
        ``(features, last_hidden_state [b, s, h])``: ``last_hidden_state @ W^T`` are the
        target's logits.
        """
        if len(self.layers) < self.num_layers:
            raise ValueError("this target was loaded without its decoder layers (training from a feature store): "
                             "it has no features to compute")
        kwargs = {"attention_mask": attention_mask}
        if doc_ids is not None:
            kwargs = self.packed_inputs(doc_ids)
        with self._capture(layer_ids, truncate=not final_hidden) as captured:
            out = self._layer_owner(input_ids=input_ids, use_cache=False, **kwargs)
        final = out.last_hidden_state if final_hidden else None
        del out  # the truncated run's last state is dead: free it before the concatenation
        features = torch.cat([captured[i] for i in layer_ids], dim=-1)
        return (features, final) if final_hidden else features

    def packed_inputs(self, doc_ids: torch.Tensor) -> dict:
        """``position_ids`` and attention mask of packed rows: block-diagonal causal.

        SDPA and eager take a ready 4D mask as it is (bool for SDPA; eager adds it to
        the scores, so there it is additive). Other attention implementations (flash,
        flex) get no mask: transformers detects packed rows from ``position_ids`` that
        restart at 0 and keeps each sequence to itself.
        """
        _, positions = document_layout(doc_ids)
        impl = getattr(self.model.config, "_attn_implementation", None) or "eager"
        if impl not in ("sdpa", "eager"):
            return {"position_ids": positions, "attention_mask": None}
        seq = doc_ids.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=doc_ids.device).tril()
        allowed = (doc_ids[:, None, :, None] == doc_ids[:, None, None, :]) & causal
        if impl == "eager":
            dtype = self.lm_head_weight.dtype
            allowed = torch.zeros(allowed.shape, dtype=dtype, device=doc_ids.device).masked_fill(
                ~allowed, torch.finfo(dtype).min)
        return {"position_ids": positions, "attention_mask": allowed}

    @torch.no_grad()
    def forward_with_features(self, layer_ids: list[int], **kwargs):
        """A full causal-LM forward (logits, cache) that also returns the features."""
        with self._capture(layer_ids, truncate=False) as captured:
            out = self.model(**kwargs)
        return out, torch.cat([captured[i] for i in layer_ids], dim=-1)


def _no_router_outputs(model: nn.Module) -> None:
    """Mixture-of-experts targets: turn off ``output_router_logits`` (some fine-tuned checkpoints
    save it on). It makes HF's forward keep every layer's router logits and add the router
    aux loss, which trains routers: a frozen target never needs either, and that loss reads
    the attention mask as [batch, seq], so it fails on the 4D masks of packed rows and the
    static decoder."""
    config = model.config
    for cfg in (config, config.get_text_config() if hasattr(config, "get_text_config") else config):
        if getattr(cfg, "output_router_logits", False):
            cfg.output_router_logits = False


def _target_location(path: str | os.PathLike, gguf_file: str | None) -> tuple[Path, dict]:
    """A folder (and ``gguf_file`` in it), or ``folder/file.gguf``: (folder, from_pretrained kwargs)."""
    path = Path(path)
    if path.suffix == ".gguf" and gguf_file is None:
        path, gguf_file = path.parent, path.name
    if not path.exists():
        raise FileNotFoundError(f"target not found: {path}")
    return path, ({"gguf_file": gguf_file} if gguf_file else {})


def load_tokenizer(path: str | os.PathLike, gguf_file: str | None = None):
    """The target's tokenizer alone (seconds), exactly as ``Target.load`` loads it: the data can be
    tokenized and checked before the model's weights are read (minutes for a large target)."""
    from transformers import AutoTokenizer

    path, kwargs = _target_location(path, gguf_file)
    return AutoTokenizer.from_pretrained(path, **kwargs)
