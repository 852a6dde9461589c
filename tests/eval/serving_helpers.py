"""Write a DFlash serving-format folder (spec section 4) from a drafter, for eval tests."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file


def serving_config(cfg) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "layer_types": cfg.layer_types,
        "sliding_window": cfg.sliding_window,
        "use_sliding_window": cfg.sliding_window is not None,
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
    }


def write_serving_folder(drafter, cfg, path, config_overrides: dict | None = None, drop: tuple = ()) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {**serving_config(cfg), **(config_overrides or {})}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().contiguous() for k, v in drafter.state_dict().items() if k not in drop}
    save_file(state, str(path / "model.safetensors"))
    return path
