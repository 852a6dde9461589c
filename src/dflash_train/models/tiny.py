"""Tiny random Qwen3 causal LMs (dense, and mixture-of-experts) built from a config (no download).

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


def tiny_qwen3_moe(num_layers: int = 6, hidden: int = 64, vocab: int = 128, tie: bool = False, seed: int = 0,
                   num_experts: int = 4, experts_per_token: int = 2, router_std: float = 1.0):
    """A random Qwen3-MoE causal LM (Qwen3-30B-A3B's layout, tiny): every layer's MLP is a
    sparse block of ``num_experts`` experts with top-``experts_per_token`` routing.

    HF's init (std 0.02) leaves the router's logits nearly equal, so which experts a token
    gets would hang on rounding; ``router_std`` spreads them as a trained router does, so
    the chosen experts are stable and differ from token to token (each expert sees work).
    As in Qwen3-30B-A3B (8 x 768 = 6144), the active experts' width equals the dense
    ``intermediate_size`` (``experts_per_token * moe_intermediate_size``); the bench's FLOP model
    counts the active width from the MoE fields (``models/target.moe_widths``) either way.
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    expert_width = 2 * hidden // experts_per_token
    config = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=expert_width,
        num_experts=num_experts, num_experts_per_tok=experts_per_token, norm_topk_prob=True,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
        max_position_embeddings=512, tie_word_embeddings=tie, rope_theta=10000.0,
    )
    model = Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, router_std / hidden**0.5)
    return model
