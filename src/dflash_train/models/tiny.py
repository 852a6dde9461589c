"""A tiny random Qwen3 causal LM built from a config (no download).

Used by ``bench --target-config tiny`` on CPU and by the test suite: random weights cost
the same FLOPs as real ones, and tiny shapes make exhaustive reference checks cheap.
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
