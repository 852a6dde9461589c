"""The FLOP model of bench/flops.py: a hand count, the reference figure, and a FLOP counter.

Tolerances: matmul FLOPs must agree with ``torch.utils.flop_counter.FlopCounterMode``
EXACTLY (relative 1e-9); the counter sees attention (math SDPA -> bmm) as dense
(every key of the Q x K matrix), so attention is checked against the dense count,
and the model's visible-key count is checked against the real mask's True entries.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dflash_train.bench.flops import MULTIPLIERS, QWEN3_8B, Shape, reference_flops, step_flops  # noqa: E402


def test_hand_count_tiny():
    # target and drafter: H=8, h=2 heads, g=1 kv head, d=4, I=16, V=32
    shape = Shape(hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32)
    # 3 target layers run, 2 drafter layers, 2 features, S=8, A=2 anchors at 2 and 4, B=4 -> Q=8
    flops = step_flops(shape, 3, shape, 2, 2, seq_len=8, num_anchors=2, block_size=4, mean_anchor=3)
    # params per layer: q 8*8=64 + k,v 2*8*4=64 + o 8*8=64 + mlp 3*8*16=384 = 576
    assert shape.params_per_layer == 576
    hand_forward = {
        "target_matmul": 3 * 2 * 576 * 8,  # 27648
        "target_attention": 3 * 2 * 2 * 4 * 8 * 8,  # layers * (QK, AV) * 2 * S/2 keys * h*d * S = 3072
        "drafter_fc": 2 * (2 * 8) * 8 * 8,  # 2 * n*H * H * S = 2048
        "drafter_q_o": 2 * 2 * 2 * 8 * 8 * 8,  # N * (q, o) * 2 * H * h*d * Q = 4096
        "drafter_kv_block": 2 * 2 * 2 * 8 * 4 * 8,  # N * (k, v) * 2 * H * g*d * Q = 2048
        "drafter_kv_context": 2 * 2 * 2 * 8 * 4 * 8,  # same on S = 8 context positions = 2048
        "drafter_mlp": 2 * 2 * 3 * 8 * 16 * 8,  # N * 2 * 3 * H * I * Q = 12288
        # N * (QK, AV) * 2 * h*d * B * sum_j (a_j + B) = 2 * 2 * 2 * 8 * 4 * ((2 + 4) + (4 + 4)) = 3584
        "drafter_attention": 2 * 2 * 2 * 8 * 4 * 14,
        "lm_head": 2 * 8 * 32 * 6,  # 2 * H * V * Q(B-1)/B (6 labeled positions) = 3072
    }
    assert flops.forward == pytest.approx(hand_forward, rel=1e-12)
    hand_train = (27648 + 3072  # target, forward only
                  + 2 * 2048  # fc: forward + weight grad (frozen input)
                  + 3 * (4096 + 2048 + 2048 + 12288 + 3584)  # drafter layers: fwd + input grad + weight grad
                  + 2 * 3072)  # lm_head: forward + input grad (frozen weight, no recompute)
    assert hand_train == 113152
    assert flops.total == pytest.approx(hand_train)
    assert flops.per_token == pytest.approx(113152 / 8)
    assert sum(flops.per_token_breakdown().values()) == pytest.approx(flops.per_token)


def test_reference_configuration_is_about_38_gflop():
    ref = reference_flops()
    assert QWEN3_8B.params_per_layer == 192_937_984
    assert ref.per_token / 1e9 == pytest.approx(37.24, abs=0.01)
    assert ref.per_token / 1e9 == pytest.approx(38, rel=0.05)  # the figure
    # with all 36 target layers counted, the model gives the round number
    full = step_flops(QWEN3_8B, 36, QWEN3_8B, 5, 5, 3072, 512, 16)
    assert full.per_token / 1e9 == pytest.approx(38.06, abs=0.01)
    assert set(ref.forward) == set(MULTIPLIERS)


def test_flop_counter_agrees_on_tiny_model():
    from testkit import tiny_drafter, tiny_qwen3
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from dflash_train.models.attention import build_masks
    from dflash_train.models.target import Target
    from dflash_train.objective.config import ObjectiveConfig
    from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks

    target = Target(tiny_qwen3(num_layers=6))
    drafter, cfg = tiny_drafter(target, num_layers=2, block_size=4)
    assert cfg.target_layer_ids == [1, 3]
    seq, block = 32, 4
    anchors = torch.tensor([[3, 9, 17, 25]])
    keep = torch.ones(1, 4, dtype=torch.bool)
    input_ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.ones(1, seq, dtype=torch.long)
    # the fused loss computes the lm_head input gradient in its forward: no recompute to see
    opts = ObjectiveOptions(block, cfg.mask_token_id, ObjectiveConfig(gamma=4.0))
    blocks = make_blocks(input_ids, loss_mask, anchors, keep, opts)

    with sdpa_kernel(SDPBackend.MATH):  # attention as plain bmm, which the counter counts
        with FlopCounterMode(display=False) as counter:
            features = target.features(input_ids, None, cfg.target_layer_ids)
        target_counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
        with FlopCounterMode(display=False) as counter:
            out = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
            (out.weighted_ce / blocks.weights.sum()).backward()
        drafter_counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}

    mean_anchor = anchors.float().mean().item()
    model = step_flops(Shape.of(target.facts), max(cfg.target_layer_ids) + 1, Shape.of(cfg), 2, 2, seq, 4, block,
                       mean_anchor)
    train = model.train()
    # target: matmuls exact; causal attention is half of the dense count the counter sees
    assert target_counts["aten.mm"] == pytest.approx(train["target_matmul"], rel=1e-9)
    # (some transformers versions build RoPE angles with a tiny bmm too: 512 FLOPs here)
    assert target_counts["aten.bmm"] == pytest.approx(2 * train["target_attention"], rel=1e-3)
    # drafter + loss, forward and backward: every matmul exact
    matmuls = sum(v for k, v in train.items() if not k.startswith("target") and k != "drafter_attention")
    assert drafter_counts["aten.mm"] == pytest.approx(matmuls, rel=1e-9)
    # attention: the counter sees the dense Q x (S + Q) product, 3x forward
    q_len, heads_dim = 4 * block, cfg.num_attention_heads * cfg.head_dim
    dense_attention = 2 * 2 * 2 * heads_dim * q_len * (seq + q_len)  # N * (QK, AV) * 2 * h*d * Q * K
    assert drafter_counts["aten.bmm"] == pytest.approx(3 * dense_attention, rel=1e-9)
    # the model's visible keys are exactly the mask's True entries
    mask = build_masks("sdpa", drafter.layer_types, anchors, keep, seq, block)["full_attention"]
    visible = int(mask.sum())
    assert model.forward["drafter_attention"] == pytest.approx(2 * 2 * 2 * heads_dim * visible, rel=1e-9)
