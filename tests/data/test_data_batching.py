"""BatchPlan / BatchIterator: deterministic, complete, within budget, topology-invariant, resumable."""

from __future__ import annotations

import random

import pytest
import torch

from dflash_train.data.batching import BatchIterator, BatchPlan

RNG = random.Random(0)
LENGTHS = [RNG.randint(5, 300) for _ in range(400)]
DATA = [{"input_ids": [i % 50 + 1] * n, "loss_mask": [(i + t) % 2 for t in range(n)]}
        for i, n in enumerate(LENGTHS)]


def plan(**kw) -> BatchPlan:
    return BatchPlan(LENGTHS, **{"token_budget": 1024, "seed": 3, "pad_to_multiple": 64, **kw})


def flat(batches) -> list[int]:
    return [i for b in batches for i in b]


def test_deterministic_per_seed_and_different_across_epochs():
    assert plan().epoch_micro_batches(0) == plan().epoch_micro_batches(0)
    assert plan().epoch_micro_batches(0) != plan().epoch_micro_batches(1)
    assert plan().epoch_micro_batches(0) != plan(seed=4).epoch_micro_batches(0)


@pytest.mark.parametrize("fixed_rows", [True, False])
def test_every_sample_once_and_budget_respected(fixed_rows):
    p = plan(fixed_rows=fixed_rows, max_rows=6)
    for epoch in range(3):
        batches = p.epoch_micro_batches(epoch)
        assert sorted(flat(batches)) == list(range(len(LENGTHS)))
        for b in batches:
            rows, seq = p.shape(b)
            assert rows * seq <= 1024 and seq % 64 == 0 and len(b) <= rows <= 6
            assert max(LENGTHS[i] for i in b) <= seq
            if fixed_rows:
                assert rows == min(1024 // seq, 6)
    assert 0.0 <= p.padding_waste() < 1.0


def test_bucketing_reduces_padding():
    assert plan().padding_waste() < plan(bucket_window=1).padding_waste()


def test_too_long_example_is_a_clear_error():
    with pytest.raises(ValueError, match="token_budget"):
        BatchPlan([2000], token_budget=1024, seed=0)


def test_collate_shapes_and_masks():
    it = BatchIterator(DATA, plan(), pad_id=0)
    (mb,) = it.next_step()
    rows, seq = mb.input_ids.shape
    assert mb.loss_mask.shape == mb.attention_mask.shape == (rows, seq) and mb.sample_ids.shape == (rows,)
    assert mb.input_ids.dtype == torch.long and mb.epoch == 0
    for r in range(rows):
        sid = int(mb.sample_ids[r])
        if sid < 0:
            assert mb.attention_mask[r].sum() == 0 and mb.loss_mask[r].sum() == 0 and (mb.input_ids[r] == 0).all()
            continue
        n = LENGTHS[sid]
        assert mb.attention_mask[r].sum() == n and mb.input_ids[r, :n].tolist() == DATA[sid]["input_ids"]
        assert mb.loss_mask[r, :n].tolist() == DATA[sid]["loss_mask"] and mb.loss_mask[r, n:].sum() == 0


def _step_samples(world: int, per_rank: int, steps: int) -> list[set[int]]:
    its = [BatchIterator(DATA, plan(), 0, rank=r, world_size=world, micro_batches_per_step=per_rank)
           for r in range(world)]
    out = []
    for _ in range(steps):
        ids = [int(s) for it in its for mb in it.next_step() for s in mb.sample_ids if s >= 0]
        assert len(ids) == len(set(ids))
        out.append(set(ids))
    return out


def test_topology_invariance():
    steps = 2 * len(plan().epoch_micro_batches(0)) // 6 + 3  # crosses an epoch boundary
    reference = _step_samples(1, 6, steps)
    assert _step_samples(2, 3, steps) == reference and _step_samples(3, 2, steps) == reference


def test_epoch_wraps_and_covers_everything():
    p = plan()
    n = len(p.epoch_micro_batches(0))
    it = BatchIterator(DATA, p, 0, micro_batches_per_step=4)
    seen = {0: [], 1: []}
    while it.epoch < 2:
        for mb in it.next_step():
            if mb.epoch in seen:
                seen[mb.epoch] += [int(s) for s in mb.sample_ids if s >= 0]
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(len(LENGTHS)))
    assert it.steps_per_epoch() == -(-n // 4)


def test_drop_last_drops_only_the_trailing_partial_step():
    p = plan(drop_last=True)
    n = len(p.epoch_micro_batches(0))
    per_step = next(k for k in range(3, n) if n % k)
    it = BatchIterator(DATA, p, 0, micro_batches_per_step=per_step)
    epochs = [{mb.epoch for mb in it.next_step()} for _ in range(n // per_step + 1)]
    assert all(e == {0} for e in epochs[:-1]) and epochs[-1] == {1}
    assert it.steps_per_epoch() == n // per_step


def test_resume_from_state_dict():
    a = BatchIterator(DATA, plan(), 0, rank=1, world_size=2, micro_batches_per_step=2)
    for _ in range(7):
        a.next_step()
    state = a.state_dict()
    assert all(type(v) is int for v in state.values())
    b = BatchIterator(DATA, plan(), 0, rank=1, world_size=2, micro_batches_per_step=2)
    b.load_state_dict(state)
    for _ in range(40):
        for x, y in zip(a.next_step(), b.next_step(), strict=True):
            assert torch.equal(x.sample_ids, y.sample_ids) and torch.equal(x.input_ids, y.input_ids)
            assert x.epoch == y.epoch


def test_works_with_datasets_dataset():
    import datasets

    ds = datasets.Dataset.from_list(DATA[:20])
    p = BatchPlan(LENGTHS[:20], token_budget=1024, seed=0)
    mb = BatchIterator(ds, p, pad_id=0).collate(p.epoch_micro_batches(0)[0], 0)
    row = int(mb.sample_ids[0])
    assert mb.input_ids[0, :LENGTHS[row]].tolist() == DATA[row]["input_ids"]
