"""Sequence packing: several conversations per row, computed exactly as one per row.

The reference is unpacked training: each conversation alone in its own row. Packed,
the target's features, the drafter's outputs and the per-block losses must be the
same (fp32) for the same anchors, and changing one conversation must not move
another's features or drafter outputs (the leakage check, which the old unpacked
code paths fail on a packed row).
"""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.data.batching import BatchIterator, BatchPlan
from dflash_train.models.attention import document_layout
from dflash_train.models.target import Target
from dflash_train.objective.blocks import anchor_candidates, sample_batch_anchors, uniform_anchors
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks

BLOCK = 4
LENGTHS = [9, 13, 6]  # three conversations packed into one row of SEQ
SEQ = 32


def conversations(seed: int = 0):
    """(input_ids, loss_mask) per conversation: a prompt, then a supervised answer."""
    g = torch.Generator().manual_seed(seed)
    convs = []
    for n in LENGTHS:
        ids = torch.randint(0, 100, (n,), generator=g)
        mask = torch.zeros(n, dtype=torch.long)
        mask[2:] = 1  # supervised from token 2 to the end (the next conversation starts supervised-free)
        convs.append((ids, mask))
    return convs


def packed_row(convs):
    """One row of SEQ: the conversations back to back (doc id = index), then padding (-1)."""
    ids = torch.zeros(1, SEQ, dtype=torch.long)
    mask = torch.zeros(1, SEQ, dtype=torch.long)
    docs = torch.full((1, SEQ), -1, dtype=torch.long)
    at, offsets = 0, []
    for d, (c_ids, c_mask) in enumerate(convs):
        n = len(c_ids)
        ids[0, at:at + n], mask[0, at:at + n], docs[0, at:at + n] = c_ids, c_mask, d
        offsets.append(at)
        at += n
    return ids, mask, docs, offsets


def unpacked_rows(convs):
    """One conversation per row of SEQ, right-padded (the old layout)."""
    ids = torch.zeros(len(convs), SEQ, dtype=torch.long)
    mask = torch.zeros(len(convs), SEQ, dtype=torch.long)
    attention = torch.zeros(len(convs), SEQ, dtype=torch.long)
    for r, (c_ids, c_mask) in enumerate(convs):
        n = len(c_ids)
        ids[r, :n], mask[r, :n], attention[r, :n] = c_ids, c_mask, 1
    return ids, mask, attention


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def target(request):
    model = tiny_qwen3(num_layers=4)
    model.set_attn_implementation(request.param)
    return Target(model)


LAYERS = [0, 2]


def test_document_layout_restarts_positions_per_conversation():
    docs = torch.tensor([[5, 5, 5, 2, 2, 7, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    starts, positions = document_layout(docs)
    assert starts.tolist() == [[0, 0, 0, 3, 3, 5, 6, 6], [0] * 8]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]


def test_packed_target_features_equal_unpacked(target):
    convs = conversations()
    ids, _, docs, offsets = packed_row(convs)
    packed = target.features(ids, None, LAYERS, doc_ids=docs)
    u_ids, _, u_attention = unpacked_rows(convs)
    alone = target.features(u_ids, u_attention, LAYERS)
    for d, at in enumerate(offsets):
        n = LENGTHS[d]
        torch.testing.assert_close(packed[0, at:at + n], alone[d, :n], atol=1e-5, rtol=1e-5)


def test_transformers_packed_path_equals_unpacked(target, monkeypatch):
    """Flash/flex targets get only restarting position_ids; transformers must then
    keep the packed sequences apart (checked here on the SDPA/eager kernels)."""
    convs = conversations()
    ids, _, docs, offsets = packed_row(convs)
    monkeypatch.setattr(target.model.config, "_attn_implementation_internal", "flash_attention_2", raising=False)
    positions_only = target.packed_inputs(docs)
    monkeypatch.undo()
    assert positions_only["attention_mask"] is None
    with target._capture(LAYERS, truncate=True) as captured:
        target._layer_owner(input_ids=ids, use_cache=False, **positions_only)
    packed = torch.cat([captured[i] for i in LAYERS], dim=-1)
    u_ids, _, u_attention = unpacked_rows(convs)
    alone = target.features(u_ids, u_attention, LAYERS)
    for d, at in enumerate(offsets):
        torch.testing.assert_close(packed[0, at:at + LENGTHS[d]], alone[d, :LENGTHS[d]], atol=1e-5, rtol=1e-5)


def _anchors(convs, offsets=None):
    """Every valid anchor of every conversation; in packed row indices when offsets are given."""
    per_conv = [anchor_candidates(mask) for _, mask in convs]
    if offsets is None:
        width = max(len(a) for a in per_conv)
        anchors = torch.zeros(len(convs), width, dtype=torch.long)
        keep = torch.zeros(len(convs), width, dtype=torch.bool)
        for r, a in enumerate(per_conv):
            anchors[r, :len(a)], keep[r, :len(a)] = a, True
        return anchors, keep
    flat = torch.cat([a + at for a, at in zip(per_conv, offsets)])
    return flat.unsqueeze(0), torch.ones(1, len(flat), dtype=torch.bool)


def _drafter_outputs(target, drafter, opts, ids, mask, attention, docs, anchors, keep):
    features = target.features(ids, attention, LAYERS, doc_ids=docs)
    blocks = make_blocks(ids, mask, anchors, keep, opts, docs)
    hidden = {}
    original = drafter.forward

    def spy(*args, **kwargs):  # keep the block hidden states drafter_loss computes
        hidden["out"] = original(*args, **kwargs)
        return hidden["out"]

    drafter.forward = spy
    try:
        out = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
    finally:
        del drafter.forward
    return out, blocks, hidden["out"].view(*anchors.shape, BLOCK, -1)


def _setup(target):
    drafter, cfg = tiny_drafter(target, num_layers=2, block_size=BLOCK, target_layer_ids=LAYERS)
    opts = ObjectiveOptions(BLOCK, cfg.mask_token_id, ObjectiveConfig(gamma=4.0, chunk_size=7))
    return drafter, opts


def test_packed_drafter_blocks_and_losses_equal_unpacked(target):
    drafter, opts = _setup(target)
    convs = conversations()
    ids, mask, docs, offsets = packed_row(convs)
    p_anchors, p_keep = _anchors(convs, offsets)
    packed, p_blocks, p_hidden = _drafter_outputs(target, drafter, opts, ids, mask, None, docs, p_anchors, p_keep)
    u_ids, u_mask, u_attention = unpacked_rows(convs)
    u_anchors, u_keep = _anchors(convs)
    alone, u_blocks, u_hidden = _drafter_outputs(target, drafter, opts, u_ids, u_mask, u_attention, None,
                                                 u_anchors, u_keep)
    lm_head = target.lm_head_weight
    j = 0
    for r in range(len(convs)):
        for a in range(int(u_keep[r].sum())):
            assert int(p_blocks.positions.view(1, -1, BLOCK)[0, j, 0]) == int(u_anchors[r, a])
            torch.testing.assert_close(p_blocks.labels[0, j], u_blocks.labels[r, a])
            torch.testing.assert_close(p_blocks.weights[0, j], u_blocks.weights[r, a])
            torch.testing.assert_close(p_hidden[0, j] @ lm_head.t(), u_hidden[r, a] @ lm_head.t(), atol=1e-5, rtol=1e-5)
            assert torch.equal(packed.correct[0, j], alone.correct[r, a])
            j += 1
    assert j == p_anchors.shape[1]
    torch.testing.assert_close(packed.weighted_ce, alone.weighted_ce, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(p_blocks.weights.sum(), u_blocks.weights.sum())


def test_changing_one_conversation_moves_no_other(target):
    """The leakage check: edit conversation 0's tokens; conversations 1 and 2 keep their
    features and drafter outputs exactly. The same row without ``doc_ids`` (the
    unpacked code path) leaks, so this test can fail."""
    drafter, opts = _setup(target)
    convs = conversations()
    edited = [(convs[0][0].flip(0), convs[0][1])] + convs[1:]
    anchors, keep = _anchors(convs, packed_row(convs)[3])
    first_other = int(anchor_candidates(convs[0][1]).numel())  # blocks of conversation 0 come first

    def run(cs, docs_on: bool):
        ids, mask, docs, _ = packed_row(cs)
        docs_arg = docs if docs_on else None
        feats = target.features(ids, None, LAYERS, doc_ids=docs_arg)
        _, _, hidden = _drafter_outputs(target, drafter, opts, ids, mask, None, docs_arg, anchors, keep)
        return feats, hidden

    start = LENGTHS[0]
    for docs_on in (True, False):
        (f0, h0), (f1, h1) = run(convs, docs_on), run(edited, docs_on)
        features_moved = not torch.equal(f0[0, start:], f1[0, start:])
        blocks_moved = not torch.equal(h0[0, first_other:], h1[0, first_other:])
        assert features_moved == blocks_moved == (not docs_on)


def test_packed_anchors_stay_inside_one_conversation():
    convs = conversations()
    ids, mask, docs, offsets = packed_row(convs)
    # token 0 of conversation 1 supervised too: the last token of 0 must still not anchor across
    mask[0, offsets[1]] = 1
    anchors, keep = sample_batch_anchors(mask, torch.tensor([0]), 64, seed=1, epoch=0, doc_ids=docs)
    chosen = anchors[0][keep[0]]
    assert set(chosen.tolist()) == set(anchor_candidates(mask[0], docs[0]).tolist())
    assert offsets[1] - 1 not in chosen.tolist()
    assert all(docs[0, a] == docs[0, a + 1] for a in chosen.tolist())
    few, few_keep = sample_batch_anchors(mask, torch.tensor([0]), 5, seed=1, epoch=0, doc_ids=docs)
    again, _ = sample_batch_anchors(mask, torch.tensor([0]), 5, seed=1, epoch=0, doc_ids=docs)
    assert torch.equal(few, again) and int(few_keep.sum()) == 5
    blocks = make_blocks(ids, mask, anchors, keep, ObjectiveOptions(BLOCK, 127, ObjectiveConfig(gamma=4.0)), docs)
    label_rows = anchors.unsqueeze(-1) + torch.arange(BLOCK)
    crossing = docs[0, label_rows.clamp(max=SEQ - 1)] != docs[0, anchors].unsqueeze(-1)
    assert not (blocks.valid & crossing).any() and (crossing & keep.unsqueeze(-1)).any()
    uni, uni_keep = uniform_anchors(mask, 16, BLOCK, docs)
    starts = uni[0][uni_keep[0]].tolist()
    assert starts == [2, 6, 11, 15, 19, 24]  # each conversation tiles anew from its first answer token


# -- batching ------------------------------------------------------------------------------------
def _dataset(lengths):
    return [{"input_ids": list(range(1, n + 1)), "loss_mask": [1] * n} for n in lengths]


def test_packed_plan_covers_every_sample_once_with_static_rows_and_less_padding():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 200, (500,), generator=g).tolist()
    packed = BatchPlan(lengths, token_budget=2048, seed=3, pad_to_multiple=64, pack_length=256, bucket_window=128)
    plain = BatchPlan(lengths, token_budget=2048, seed=3, pad_to_multiple=64)
    for epoch in (0, 1):
        batches = packed.epoch_micro_batches(epoch)
        ids = [i for mb in batches for row in mb for i in row]
        assert sorted(ids) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in row) <= 256 for mb in batches for row in mb)
        assert all(len(mb) <= 8 for mb in batches)
    assert packed.epoch_micro_batches(0) != packed.epoch_micro_batches(1)
    assert packed.padding_waste() < 0.5 * plain.padding_waste(), (packed.padding_waste(), plain.padding_waste())
    it = BatchIterator(_dataset(lengths), packed, pad_id=0)
    mb = it.next_step()[0]
    assert mb.input_ids.shape == (8, 256) and mb.doc_ids.shape == (8, 256)
    for r, row in enumerate(packed.epoch_micro_batches(0)[0]):
        at = 0
        for idx in row:
            n = lengths[idx]
            assert mb.doc_ids[r, at:at + n].eq(idx).all() and mb.input_ids[r, at:at + n].tolist() == list(
                range(1, n + 1))
            at += n
        assert mb.doc_ids[r, at:].eq(-1).all() and int(mb.attention_mask[r].sum()) == at
    assert mb.num_samples() == sum(len(row) for row in packed.epoch_micro_batches(0)[0])


def test_packed_iterator_resumes_exactly():
    lengths = [30 + (7 * i) % 90 for i in range(200)]
    plan = BatchPlan(lengths, token_budget=512, seed=0, pad_to_multiple=64, pack_length=128)
    data = _dataset(lengths)
    it = BatchIterator(data, plan, pad_id=0, micro_batches_per_step=2)
    for _ in range(3):
        it.next_step()
    state = it.state_dict()
    want = [mb.doc_ids for mb in it.next_step()]
    again = BatchIterator(data, plan, pad_id=0, micro_batches_per_step=2)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(want, [mb.doc_ids for mb in again.next_step()]))


def test_packing_rejects_examples_longer_than_a_row():
    with pytest.raises(ValueError, match="does not fit a row of 64"):
        BatchPlan([10, 65], token_budget=256, seed=0, pack_length=64)


def test_packed_training_learns_with_less_padding(tmp_path):
    """The trainer end to end with ``data.pack``: fewer padded slots, and it learns."""
    import json
    from pathlib import Path

    from testkit import tiny_chat_job, tiny_chat_target

    from dflash_train.config import config_from_dict
    from dflash_train.train.loop import train

    smollm2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
    logs = {}
    for pack in (False, True):
        job = tiny_chat_job(tmp_path / str(pack), max_steps=16)
        job["data"].update(pack=pack, max_length=256, token_budget=512, pad_to_multiple=256)
        lines: list[str] = []
        echo = lines.append
        train(config_from_dict(job), target=tiny_chat_target(smollm2), echo=lambda *a, echo=echo: echo(" ".join(map(str, a))))
        waste = next(line for line in lines if "padding waste" in line)
        records = [json.loads(x) for x in (tmp_path / str(pack) / "run" / "metrics.jsonl").read_text().splitlines()]
        curve = [r["loss"] for r in records if "loss" in r]
        logs[pack] = (float(waste.rsplit("padding waste ", 1)[1].rstrip("%")), curve)
    assert logs[True][0] < logs[False][0] / 2, logs
    curve = logs[True][1]
    assert len(curve) == 16 and sum(curve[-4:]) < 0.8 * sum(curve[:4]), curve
