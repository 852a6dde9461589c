"""Tiny random targets and drafters built from configs (no download).

Used by the test suite and by ``bench`` on CPU: random weights cost the same FLOPs
as real ones, and tiny shapes make exhaustive reference checks cheap.
"""

from __future__ import annotations

import torch


def tiny_qwen3(num_layers: int = 6, hidden: int = 64, vocab: int = 128, tie: bool = False, seed: int = 0):
    """A random Qwen3 causal LM small enough for exhaustive CPU tests."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=512,
        tie_word_embeddings=tie, rope_theta=10000.0,
    )
    return Qwen3ForCausalLM(config).eval()


def tiny_drafter(target, num_layers=2, block_size=4, layer_types=None, sliding_window=None, seed=0, **kw):
    """A resolved drafter for ``target`` (a ``Target``) with every weight perturbed."""
    from dflash_train.models.config import DrafterConfig, resolve_drafter_config
    from dflash_train.models.drafter import DFlashDrafter

    cfg = DrafterConfig(num_hidden_layers=num_layers, block_size=block_size, layer_types=layer_types,
                        sliding_window=sliding_window, **kw)
    cfg = resolve_drafter_config(cfg, target.facts, mask_token_id=target.facts.vocab_size - 1)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(cfg)
    for p in drafter.parameters():  # norms start at 1; perturb so tests see every weight
        p.data.add_(0.02 * torch.randn_like(p))
    return drafter, cfg
