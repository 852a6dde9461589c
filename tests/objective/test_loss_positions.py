"""``objective.loss_positions``: only block positions 1..K reach the lm_head, and the result is
exactly the full objective with the weights of positions past K set to zero."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.models.target import Target
from dflash_train.objective.blocks import sample_batch_anchors
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks

BLOCK = 6


def _batch(seed=0, rows=2, seq=30):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (rows, seq), generator=g)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :5] = 0
    loss_mask[1, 20:] = 0  # blocks that run past the supervised span
    anchors, keep = sample_batch_anchors(loss_mask, torch.arange(rows), 7, 0, 0)
    return ids, loss_mask, anchors, keep


def _loss_and_grads(target, drafter, blocks, opts):
    ids = _batch()[0]
    features = target.features(ids, torch.ones_like(ids), drafter.config.target_layer_ids)
    out = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
    drafter.zero_grad(set_to_none=True)
    (out.weighted_ce / blocks.weights.sum()).backward()
    return out, [p.grad.clone() for p in drafter.parameters()]


@pytest.mark.parametrize("last", [1, 3, BLOCK - 1])
def test_limited_positions_equal_the_full_loss_with_later_weights_zeroed(last, monkeypatch):
    """The reference runs every position through the lm_head with weights 0 past ``last``; the
    limited objective must give its loss, gradients and per-position correctness, while the lm_head
    sees only ``last`` positions per block."""
    import dflash_train.objective.loss as loss_mod

    target = Target(tiny_qwen3())
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=BLOCK, seed=3)
    ids, loss_mask, anchors, keep = _batch()
    full = ObjectiveOptions(BLOCK, 3, ObjectiveConfig(gamma=2.0, chunk_size=5))
    ref_blocks = make_blocks(ids, loss_mask, anchors, keep, full)
    past = torch.arange(BLOCK) > last
    ref_blocks.weights = ref_blocks.weights * ~past
    ref_blocks.valid = ref_blocks.valid & ~past
    ref, ref_grads = _loss_and_grads(target, drafter, ref_blocks, full)

    rows_seen = []
    original = loss_mod._chunk_forward
    monkeypatch.setattr(loss_mod, "_chunk_forward", lambda h, *a: rows_seen.append(h.shape[0]) or original(h, *a))
    limited = ObjectiveOptions(BLOCK, 3, ObjectiveConfig(gamma=2.0, chunk_size=5, loss_positions=last))
    blocks = make_blocks(ids, loss_mask, anchors, keep, limited)
    out, grads = _loss_and_grads(target, drafter, blocks, limited)

    assert sum(rows_seen) == anchors.numel() * last
    # the trainer normalizes by the blocks' weight total (TrainStep.global_weight), not by the loss's
    assert torch.equal(blocks.weights, ref_blocks.weights) and torch.equal(blocks.valid, ref_blocks.valid)
    torch.testing.assert_close(out.weighted_ce, ref.weighted_ce)
    for g, g_ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, g_ref)
    assert torch.equal(out.correct, ref.correct[..., :last]) and torch.equal(out.valid, ref.valid[..., :last])
    assert not ref.valid[..., last:].any()


def test_all_positions_is_the_default():
    ids, loss_mask, anchors, keep = _batch()
    a = make_blocks(ids, loss_mask, anchors, keep, ObjectiveOptions(BLOCK, 3, ObjectiveConfig(gamma=2.0)))
    b = make_blocks(ids, loss_mask, anchors, keep, ObjectiveOptions(BLOCK, 3, ObjectiveConfig(gamma=2.0, loss_positions=BLOCK - 1)))
    assert torch.equal(a.weights, b.weights) and a.valid[..., -1].any()


@pytest.mark.parametrize("bad", [0, BLOCK])
def test_out_of_range_positions_are_refused(bad):
    with pytest.raises(ValueError, match="loss_positions"):
        ObjectiveOptions(BLOCK, 3, ObjectiveConfig(gamma=2.0, loss_positions=bad))


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_config_refuses_non_positive_integers(bad):
    with pytest.raises(ValueError, match="objective.loss_positions"):
        ObjectiveConfig(loss_positions=bad).validate()


def test_the_job_config_refuses_positions_past_the_block():
    """Checked when the config loads, before the target or the data are touched."""
    from dflash_train.config import load_config

    with pytest.raises(ValueError, match=r"objective.loss_positions \(16\) must be at most drafter.block_size - 1 \(15\)"):
        load_config("smollm2-1gpu", ["objective.loss_positions=16"])
    assert load_config("smollm2-1gpu", ["objective.loss_positions=15"]).objective.loss_positions == 15
