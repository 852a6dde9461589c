"""What ``objective/blocks.py`` must compute, pinned where mutation testing found it unchecked (issue 60.4).

mutmut over ``blocks.py`` left 52 mutants alive. The meaningful ones sat in paths the other tests
never take: a block reaching the row's last token (``index < seq``, the gather clamped at ``seq - 1``),
``predicting_positions`` with several anchors and dropped labels, fixed uniform blocks without packing
(never called) and with it (conversation boundaries), packed anchors keyed by each conversation's own
generator, a padding row before a real one and packed micro-batches of several rows, the paper's decay
table and its interpolation, a NaN in the per-position accuracies, and the exact seed of an anchor
generator. Every check is against a loop over positions written from the docstrings or a value by hand.
The equivalent survivors, and why: ``docs/faults.md`` (item 4).
"""

from __future__ import annotations

import math

import pytest
import torch

from dflash_train.objective.blocks import (
    anchor_candidates,
    anchor_generator,
    build_blocks,
    decay_weights,
    default_gamma,
    expected_acceptance_from_accuracy,
    predicting_positions,
    sample_batch_anchors,
    sample_packed_anchors,
    uniform_anchors,
)


def _brute_blocks(ids, loss_mask, anchors, keep, block_size, gamma, doc_ids=None, last=None):
    """labels, valid, weights, positions by a loop over rows, blocks and offsets (spec 2.3, 2.6)."""
    rows, seq = ids.shape
    last = block_size - 1 if last is None else last
    shape = (rows, anchors.shape[1], block_size)
    labels, valid = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.bool)
    weights, positions = torch.zeros(shape), torch.zeros(shape, dtype=torch.long)
    for r in range(rows):
        for j, a in enumerate(anchors[r].tolist()):
            start = 0 if doc_ids is None else a
            if doc_ids is not None:
                while start > 0 and doc_ids[r, start - 1] == doc_ids[r, a]:
                    start -= 1
            for k in range(block_size):
                t = a + k
                positions[r, j, k] = t - start
                ok = (0 < k <= last and t < seq and bool(keep[r, j]) and loss_mask[r, t] > 0
                      and (doc_ids is None or doc_ids[r, t] == doc_ids[r, a]))
                if ok:
                    valid[r, j, k], labels[r, j, k] = True, ids[r, t]
                    weights[r, j, k] = math.exp(-(k - 1) / gamma)
    return labels, valid, weights, positions


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_blocks_reaching_the_last_token_equal_a_loop(packed):
    """Anchors near the row's end: a label at ``seq - 1`` counts, one at ``seq`` does not (the gather
    clamps there); the last token is supervised, so a wrong bound or clamp shows."""
    seq, block_size = 12, 4
    ids = torch.arange(50, 50 + 2 * seq).view(2, seq)
    loss_mask = torch.ones(2, seq, dtype=torch.long)
    loss_mask[1, :3] = 0
    anchors = torch.tensor([[seq - 2, seq - 3, 0], [seq - 2, 3, 6]])
    keep = torch.tensor([[True, True, True], [True, True, False]])
    doc_ids = torch.tensor([[0] * 5 + [1] * 7, [2] * 8 + [3] * 4]) if packed else None
    blocks = build_blocks(ids, loss_mask, anchors, keep, block_size, mask_token_id=1, gamma=3.0, doc_ids=doc_ids)
    labels, valid, weights, positions = _brute_blocks(ids, loss_mask, anchors, keep, block_size, 3.0, doc_ids)
    assert blocks.valid.tolist() == valid.tolist()
    assert blocks.labels.tolist() == labels.tolist()
    torch.testing.assert_close(blocks.weights, weights)
    assert blocks.positions.view(positions.shape).tolist() == positions.tolist()
    assert blocks.valid[0, 0].tolist() == [False, True, False, False]  # seq - 1 counts, seq does not


def test_predicting_positions_are_one_before_each_label_and_the_anchor_where_none_counts():
    ids = torch.arange(30).view(1, 30)
    loss_mask = torch.ones(1, 30, dtype=torch.long)
    loss_mask[0, 9] = 0
    anchors = torch.tensor([[2, 7, 26]])
    keep = torch.tensor([[True, True, True]])
    blocks = build_blocks(ids, loss_mask, anchors, keep, block_size=6, mask_token_id=1, gamma=4.0)
    at = predicting_positions(blocks)
    expected = [[a + k - 1 if blocks.valid[0, j, k] else a for k in range(1, 6)]
                for j, a in enumerate(anchors[0].tolist())]
    assert at.tolist() == [expected]
    assert expected[1][1] == 7 and expected[2][3] == 26  # loss_mask[9] == 0; 26 + 4 is past the row


def test_uniform_blocks_without_packing_tile_from_the_first_supervised_anchor():
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
                              [0] * 12,
                              [1] * 12])
    anchors, keep = uniform_anchors(loss_mask, num_anchors=3, block_size=3)
    assert anchors.dtype == torch.long
    assert anchors.tolist() == [[2, 5, 8], [0, 0, 0], [0, 3, 6]]
    assert keep.tolist() == [[True] * 3, [False] * 3, [True] * 3]


def test_uniform_blocks_of_a_packed_row_restart_at_each_conversation():
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]])
    doc_ids = torch.tensor([[4, 4, 4, 4, 4, 4, 9, 9, 9, 9, 9, 9, 9, 9]])
    anchors, keep = uniform_anchors(loss_mask, num_anchors=6, block_size=2, doc_ids=doc_ids)
    # conversation 4: candidates 1..4 -> 1, 3; conversation 9: 7..12 -> 7, 9, 11 (5 -> 6 crosses a boundary)
    assert anchors.tolist() == [[1, 3, 7, 9, 11, 0]]
    assert keep.tolist() == [[True] * 5 + [False]]
    # supervised across the boundary: 5 -> 6 is still no candidate (6 is another conversation's)
    anchors, keep = uniform_anchors(torch.ones_like(loss_mask), num_anchors=8, block_size=5, doc_ids=doc_ids)
    assert anchors[keep].tolist() == [0, 6, 11]  # 5 would start conversation 4's second block


def test_packed_anchors_take_each_conversations_keys_from_its_own_generator():
    """The reference: each conversation's candidates get keys from ``anchor_generator(seed, epoch, id)``
    in order; the smallest ``num_anchors`` keys win."""
    loss_mask = torch.ones(20, dtype=torch.long)
    doc_ids = torch.tensor([5] * 7 + [2] * 9 + [8] * 4)
    for num_anchors in (1, 4, 9):
        candidates = anchor_candidates(loss_mask, doc_ids)
        keys = torch.empty(candidates.numel())
        for sample_id in (5, 2, 8):
            here = doc_ids[candidates] == sample_id
            keys[here] = torch.rand(int(here.sum()), generator=anchor_generator(11, 3, sample_id))
        expected = candidates[keys.argsort()[:num_anchors]].sort().values
        anchors, keep = sample_packed_anchors(loss_mask, doc_ids, num_anchors, seed=11, epoch=3)
        assert anchors[keep].tolist() == expected.tolist()


def test_a_padding_row_before_real_ones_and_every_packed_row_get_their_anchors():
    loss_mask = torch.ones(3, 16, dtype=torch.long)
    anchors, keep = sample_batch_anchors(loss_mask, torch.tensor([-1, 4, 6]), 5, seed=0, epoch=0)
    assert keep.tolist() == [[False] * 5, [True] * 5, [True] * 5]
    doc_ids = torch.tensor([[1] * 8 + [2] * 8, [3] * 16, [-1] * 16])
    anchors, keep = sample_batch_anchors(loss_mask, torch.tensor([1, 3, -1]), 5, seed=0, epoch=0, doc_ids=doc_ids)
    for row in range(2):
        want, _ = sample_packed_anchors(loss_mask[row], doc_ids[row], 5, seed=0, epoch=0)
        assert keep[row].all() and anchors[row].tolist() == want.tolist()
    assert not keep[2].any()


def test_anchor_generator_seed_is_the_two_words_of_the_seed_sequence():
    """The seed of (seed, epoch, sample) is fixed across versions: a resumed or rerun job draws the
    anchors it drew before. 12236307108686981754 = state[0] << 32 | state[1] of
    ``SeedSequence([3, 1, 42]).generate_state(2)``, computed once."""
    assert anchor_generator(3, 1, 42).initial_seed() == 12236307108686981754


@pytest.mark.parametrize(("block_size", "gamma"), [(16, 7.0), (10, 5.0), (8, 4.0), (12, 5.5), (4, 2.5), (2, 1.75),
                                                   (1, 1.375), (24, 10.0)])
def test_default_gamma_is_the_papers_table_and_linear_elsewhere(block_size, gamma):
    assert default_gamma(block_size) == gamma


def test_expected_acceptance_stops_at_the_first_position_without_a_measure():
    assert expected_acceptance_from_accuracy([0.5, float("nan"), 0.9]) == 1.5
    assert expected_acceptance_from_accuracy([]) == 1.0


def test_decay_weights_are_float32_and_zero_at_the_anchor():
    w = decay_weights(4, 2.0)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, torch.tensor([0.0, 1.0, math.exp(-0.5), math.exp(-1.0)]))
