"""Anchors, blocks, labels and the chunked loss against simple references."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter

from dflash_train.models.attention import build_masks
from dflash_train.objective.blocks import (
    anchor_candidates,
    build_blocks,
    decay_weights,
    expected_acceptance_from_accuracy,
    sample_anchors,
    sample_batch_anchors,
)
from dflash_train.objective.loss import (
    LossOptions,
    acceptance_stats,
    chunked_weighted_ce,
    dflash_loss,
    reference_loss,
)


def test_anchors_obey_loss_mask_rule_and_are_fresh_per_epoch():
    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        loss_mask = (torch.rand(40, generator=g) > 0.3).long()
        anchors, keep = sample_anchors(loss_mask, 8, torch.Generator().manual_seed(trial))
        chosen = anchors[keep].tolist()
        assert chosen == sorted(set(chosen))
        for a in chosen:
            assert loss_mask[a] == 1 and loss_mask[a + 1] == 1
        assert len(chosen) == min(8, anchor_candidates(loss_mask).numel())
    mask = torch.ones(1, 64, dtype=torch.long)
    ids = torch.tensor([7])
    a0, _ = sample_batch_anchors(mask, ids, 8, seed=1, epoch=0)
    a0_again, _ = sample_batch_anchors(mask, ids, 8, seed=1, epoch=0)
    a1, _ = sample_batch_anchors(mask, ids, 8, seed=1, epoch=1)
    assert torch.equal(a0, a0_again) and not torch.equal(a0, a1)


def test_uniform_over_candidates():
    counts = torch.zeros(10)
    mask = torch.ones(10, dtype=torch.long)  # candidates 0..8
    for trial in range(3000):
        anchors, keep = sample_anchors(mask, 1, torch.Generator().manual_seed(trial))
        counts[anchors[keep]] += 1
    freq = counts[:9] / counts.sum()
    assert counts[9] == 0 and torch.all((freq - 1 / 9).abs() < 0.02)


def test_blocks_labels_are_same_position_and_weighted():
    ids = torch.arange(100, 120).view(1, 20)
    loss_mask = torch.zeros(1, 20, dtype=torch.long)
    loss_mask[0, 5:18] = 1
    anchors = torch.tensor([[5, 14, 0]])
    keep = torch.tensor([[True, True, False]])
    blocks = build_blocks(ids, loss_mask, anchors, keep, block_size=5, mask_token_id=9, gamma=2.0)
    assert blocks.tokens.view(3, 5)[:, 0].tolist() == [105, 114, 100]
    assert (blocks.tokens.view(3, 5)[:, 1:] == 9).all()
    assert blocks.positions.view(3, 5)[0].tolist() == [5, 6, 7, 8, 9]
    assert blocks.labels[0, 0].tolist() == [0, 106, 107, 108, 109]
    # block 2: positions 14..18, loss_mask ends at 17 -> labels at 15, 16, 17 only
    assert blocks.valid[0, 1].tolist() == [False, True, True, True, False]
    assert not blocks.valid[0, 2].any()
    w = torch.exp(-torch.arange(4.0) / 2.0)
    torch.testing.assert_close(blocks.weights[0, 0, 1:], w)
    assert decay_weights(5, 2.0)[0] == 0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_chunked_loss_and_gradients_equal_unchunked_reference(compiled):
    """The trainer compiles the chunks on CUDA; the compiled chunk (Inductor's CPU backend here)
    must give the reference's loss, gradient and argmax too."""
    g = torch.Generator().manual_seed(0)
    rows, num_blocks, block, hidden, vocab = 2, 3, 5, 16, 50
    h = torch.randn(rows, num_blocks * block, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    labels = torch.randint(0, vocab, (rows, num_blocks, block), generator=g)
    valid = torch.rand(rows, num_blocks, block, generator=g) > 0.2
    valid[..., 0] = False
    weights = decay_weights(block, 3.0).double() * valid
    out = dflash_loss(h, head, labels, weights, valid, LossOptions(chunk_size=7, compiled=compiled))
    loss = out.weighted_ce / weights[..., 1:].sum()
    (grad,) = torch.autograd.grad(loss, h)
    h_ref = h.detach().clone().requires_grad_()
    ref = reference_loss(h_ref.view(rows, num_blocks, block, hidden), head, labels, weights, valid)
    (grad_ref,) = torch.autograd.grad(ref, h_ref)
    torch.testing.assert_close(loss.double(), ref)
    torch.testing.assert_close(grad, grad_ref)
    assert torch.all(grad.view(rows, num_blocks, block, hidden)[:, :, 0] == 0)
    argmax = (h.detach().view(rows, num_blocks, block, hidden) @ head.t()).argmax(-1)
    assert torch.equal(out.correct, (argmax == labels)[..., 1:] & valid[..., 1:])


def test_chunked_ce_never_builds_all_logits(monkeypatch):
    import dflash_train.objective.loss as loss_mod

    sizes = []
    original = loss_mod._chunk_forward

    def spy(hidden, *args):
        sizes.append(hidden.shape[0])
        return original(hidden, *args)

    monkeypatch.setattr(loss_mod, "_chunk_forward", spy)
    h = torch.randn(100, 8, requires_grad=True)
    loss, _ = chunked_weighted_ce(h, torch.randn(30, 8), torch.zeros(100, dtype=torch.long), torch.ones(100), LossOptions(32))
    loss.backward()
    # four chunks of at most 32 rows, as even as possible (one compiled shape); backward rebuilt nothing
    assert sizes == [25, 25, 25, 25]


def test_expected_acceptance_per_block():
    correct = torch.tensor([[[True, True, False, True], [False, True, True, True]]])
    valid = torch.ones_like(correct)
    keep = torch.tensor([[True, True]])
    stats = acceptance_stats(correct, valid, keep)
    assert stats.accepted_sum.item() == (1 + 2) + (1 + 0)
    assert stats.correct_per_position.tolist() == [1, 2, 1, 2]
    assert expected_acceptance_from_accuracy([1.0, 0.5, 0.5]) == 1 + 1 + 0.5 + 0.25


def test_block_output_ignores_own_anchor_feature(tiny_target):
    """Perturbing the context feature at a_j (or later) must not move block j;
    perturbing a_j - 1 must (the spec's failure mode: seeing the anchor's state)."""
    drafter, cfg = tiny_drafter(tiny_target, block_size=4)
    seq = 12
    feats = torch.randn(1, seq, len(cfg.target_layer_ids) * cfg.hidden_size)
    anchors, keep = torch.tensor([[3, 7]]), torch.ones(1, 2, dtype=torch.bool)
    ids = torch.randint(0, 100, (1, seq))
    blocks = build_blocks(ids, torch.ones_like(ids), anchors, keep, 4, cfg.mask_token_id, 7.0)
    masks = build_masks("sdpa", drafter.layer_types, anchors, keep, seq, 4)
    embeds = tiny_target.embed(blocks.tokens)
    pos = torch.arange(seq).view(1, -1)

    def run(f):
        return drafter(embeds, f, blocks.positions, pos, masks)

    base = run(feats)
    for where, moves in [(3, False), (5, False), (2, True)]:
        f2 = feats.clone()
        f2[0, where] += 1.0
        changed = (run(f2)[0, :4] - base[0, :4]).abs().max() > 1e-6
        assert changed == moves, f"feature at {where}"


def test_each_weighting_names_its_normalizer_dpace_the_label_count_the_others_the_decay_sum():
    """D-PACE divides the step by its number of labels (docs/spec.md 2b), decay and reach by the
    decay weights' sum: the two differ whenever gamma makes weights below 1 (a mutant that gave
    dpace the decay sum survived every other test)."""
    from dflash_train.objective.weighting import WEIGHTINGS

    weights = torch.tensor([1.0, 0.5, 0.25, 0.0])
    valid = torch.tensor([True, True, True, False])
    assert float(WEIGHTINGS["dpace"].normalizer(weights, valid)) == 3.0
    assert float(WEIGHTINGS["decay"].normalizer(weights, valid)) == 1.75
    assert float(WEIGHTINGS["reach"].normalizer(weights, valid)) == 1.75
