"""Load a DFlash serving-format folder (spec section 4) as a :class:`DFlashDrafter`.

The folder holds ``config.json`` (Qwen3 fields, ``block_size``, ``num_target_layers``,
``layer_types``, ``dflash_config.{mask_token_id,target_layer_ids}``) and
``model.safetensors`` whose tensor names equal the drafter's ``state_dict`` names
(no embedding, no lm_head). Every mismatch with the target is reported by name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dflash_train.models.config import FULL_ATTENTION, SLIDING_ATTENTION, DrafterConfig
from dflash_train.models.drafter import DFlashDrafter

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "block_size")


def read_drafter_config(path: str | os.PathLike) -> DrafterConfig:
    """Parse a serving ``config.json`` into a :class:`DrafterConfig` (not yet checked
    against a target)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"drafter folder {path} has no config.json")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{cfg_file}: not valid JSON ({err})") from err
    missing = [k for k in REQUIRED if k not in raw]
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        missing.append("dflash_config")
    else:
        missing += [f"dflash_config.{k}" for k in ("mask_token_id", "target_layer_ids") if k not in dflash]
    if missing:
        raise ValueError(f"{cfg_file}: not a DFlash drafter config, missing {missing}")

    heads = int(raw["num_attention_heads"])
    rope = dict(raw.get("rope_parameters") or {})
    theta = raw.get("rope_theta") or rope.get("rope_theta") or 10000.0
    scaling = raw.get("rope_scaling") or None
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    num_layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types") or [FULL_ATTENTION] * num_layers
    sliding_window = raw.get("sliding_window")
    if SLIDING_ATTENTION not in layer_types:
        sliding_window = None
    cfg = DrafterConfig(
        num_hidden_layers=num_layers,
        block_size=int(raw["block_size"]),
        hidden_size=int(raw["hidden_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        intermediate_size=int(raw["intermediate_size"]),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_position_embeddings=raw.get("max_position_embeddings"),
        vocab_size=raw.get("vocab_size"),
        num_target_layers=raw.get("num_target_layers"),
        target_layer_ids=[int(i) for i in dflash["target_layer_ids"]],
        num_target_features=len(dflash["target_layer_ids"]),
        mask_token_id=int(dflash["mask_token_id"]),
        layer_types=list(layer_types),
        sliding_window=sliding_window,
        attention_bias=bool(raw.get("attention_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )
    try:
        cfg.validate()
    except ValueError as err:
        raise ValueError(f"{cfg_file}: {err}") from err
    return cfg


def check_against_target(cfg: DrafterConfig, target, where: str = "drafter") -> None:
    """Raise ``ValueError`` naming every field that does not fit ``target``."""
    facts = target.facts
    errors = []
    if cfg.hidden_size != facts.hidden_size:
        errors.append(f"hidden_size {cfg.hidden_size} != the target's {facts.hidden_size}")
    if cfg.num_target_layers is not None and cfg.num_target_layers != facts.num_hidden_layers:
        errors.append(f"num_target_layers {cfg.num_target_layers} != the target's {facts.num_hidden_layers} layers")
    bad = [i for i in cfg.target_layer_ids or [] if not 0 <= i < facts.num_hidden_layers]
    if bad:
        errors.append(
            f"target_layer_ids {bad} out of range for a target with {facts.num_hidden_layers} layers"
        )
    if cfg.vocab_size is not None and cfg.vocab_size != facts.vocab_size:
        errors.append(f"vocab_size {cfg.vocab_size} != the target's {facts.vocab_size}")
    if cfg.mask_token_id is not None and not 0 <= cfg.mask_token_id < facts.vocab_size:
        errors.append(f"mask_token_id {cfg.mask_token_id} has no row in the target's {facts.vocab_size}-row embedding")
    if errors:
        raise ValueError(f"{where} does not match the target: " + "; ".join(errors))


def load_drafter_folder(
    path: str | os.PathLike, target, dtype: torch.dtype | None = None, device=None
) -> DFlashDrafter:
    """Build the drafter of a serving folder for ``target`` (eval mode, frozen).

    ``dtype``/``device`` default to those of the target's lm_head.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"drafter folder not found: {path}")
    cfg = read_drafter_config(path)
    check_against_target(cfg, target, where=f"drafter {path}")
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"drafter folder {path} has no model.safetensors")
    state = load_file(str(weights))
    drafter = DFlashDrafter(cfg)
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{weights}: tensor names do not match the DFlash layout: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    wrong = [f"{k}: {tuple(state[k].shape)} (config implies {tuple(v.shape)})"
             for k, v in expected.items() if state[k].shape != v.shape]
    if wrong:
        raise ValueError(f"{weights}: tensor shapes do not match config.json: " + "; ".join(wrong[:8]))
    drafter.load_state_dict(state, strict=True)
    ref = target.lm_head_weight
    keep_fp32_rope(drafter, device=device or ref.device, dtype=dtype or ref.dtype)
    drafter.eval().requires_grad_(False)
    return drafter


def keep_fp32_rope(drafter: DFlashDrafter, device, dtype) -> DFlashDrafter:
    """``drafter.to(device, dtype)`` but the RoPE inverse frequencies stay float32
    (``Module.to`` casts every floating buffer; bf16 frequencies shift long positions)."""
    inv_freq = drafter.rotary_emb.inv_freq.float()
    drafter.to(device=device, dtype=dtype)
    drafter.rotary_emb.inv_freq = inv_freq.to(device)
    return drafter
