"""The checkpoint manager (``train/checkpoint.py``) and what a resume must restore.

Unit tests of ``CheckpointManager`` on a toy model (prune, newest verified, the step resumed
from), then whole runs: a resume across an epoch boundary, a resume with every global RNG
scrambled (no RNG state is saved: nothing may draw from one), and a one-process check that
accumulated micro-batches give the gradient of one large batch.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_train import job, tiny_target
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.config import OptimConfig, config_from_dict
from dflash_train.data.batching import MicroBatch
from dflash_train.models.target import Target
from dflash_train.objective.step import drafter_loss, make_blocks
from dflash_train.run_folder import complete_checkpoints, newest_verified
from dflash_train.train.checkpoint import CheckpointManager, resolve_resume
from dflash_train.train.loop import train
from dflash_train.train.step import StepSpec, build_train_step
from dflash_train.train.trainer import RankInfo


# -- the manager on a toy model -------------------------------------------------------------------
class Position:
    """A stateful part as the trainer's (plain ints in, plain ints out)."""

    def __init__(self):
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def _toy(run_dir: Path, keep_last: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    clock = {"step": 0}
    position = Position()
    manager = CheckpointManager(run_dir, model=model, optimizer=optimizer, drafter=model,
                                parts={"position": position}, config={"train": {"seed": 0}},
                                drafter_config={"block_size": 4}, step=lambda: clock["step"], keep_last=keep_last,
                                echo=lambda *a: None)
    return manager, model, optimizer, position, clock


def _advance(model, optimizer, position, clock, steps: int = 1) -> None:
    for _ in range(steps):
        model(torch.randn(2, 4)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        position.value += 7
        clock["step"] += 1


def test_manager_saves_prunes_and_remembers_what_it_wrote(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=2)
    for _ in range(3):
        _advance(model, optimizer, position, clock, 2)
        manager.save()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000004", "step-00000006"]  # 2 pruned
    assert manager.written == {"step-00000002", "step-00000004", "step-00000006"}
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    saved = tmp_path / "checkpoints" / "step-00000006"
    assert json.loads((saved / "trainer_state.json").read_text()) == {"position": {"value": 42}}
    assert not (saved / "rng").exists()
    torch.testing.assert_close(load_file(str(saved / "drafter.safetensors"))["weight"], model.weight.detach())


def test_newest_verified_skips_corrupt_and_incomplete_checkpoints(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    for _ in range(3):
        _advance(model, optimizer, position, clock, 2)
        manager.save()
    folder = tmp_path / "checkpoints"
    (folder / "step-00000006" / "drafter.safetensors").write_bytes(b"rot")  # corrupt
    (folder / "step-00000008").mkdir()  # a save that never finished: no COMPLETE
    (folder / "step-00000008" / "trainer_state.json").write_text("{}")
    passed = []
    assert newest_verified(tmp_path, on_corrupt=lambda f, why: passed.append((f.name, why))) == \
        folder / "step-00000004"
    assert [name for name, _ in passed] == ["step-00000006"] and "bytes" in passed[0][1]
    said = []
    assert resolve_resume("auto", tmp_path, said.append) == folder / "step-00000004"
    assert "step-00000006 is corrupt" in said[0] and "falling back" in said[0]
    for name in ("step-00000002", "step-00000004"):
        (folder / name / "drafter.safetensors").write_bytes(b"rot")
    with pytest.raises(ValueError, match="none of its 3 complete checkpoint"):
        newest_verified(tmp_path)
    assert newest_verified(tmp_path / "no-run") is None


def test_load_restores_every_part_and_records_the_resumed_step(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    _advance(model, optimizer, position, clock, 3)
    path = manager.save()
    weight, moments = model.weight.detach().clone(), optimizer.state[model.weight]["exp_avg"].clone()
    other, model2, optimizer2, position2, clock2 = _toy(tmp_path, seed=1)
    _advance(model2, optimizer2, position2, clock2, 1)  # some other state, overwritten by the load
    clock2["step"] = 0
    other.load(path)
    torch.testing.assert_close(model2.weight.detach(), weight, rtol=0, atol=0)
    torch.testing.assert_close(optimizer2.state[model2.weight]["exp_avg"], moments, rtol=0, atol=0)
    assert position2.value == 21
    assert other.resumed_step == 0  # the step callable says where training stands: the caller's counters
    clock2["step"] = 3
    other.load(path)
    assert other.resumed_step == 3 and other.written == set()
    # this run's own step 3 (where it resumed) is replaced by a new save, not kept aside
    other.save()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000003"]


def test_load_refuses_a_different_config(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path)
    path = manager.save()
    manager.config = {"train": {"seed": 1}}
    with pytest.raises(ValueError, match=r"train\.seed: checkpoint 0 vs now 1"):
        manager.load(path)


# -- whole runs: what a resume restores -----------------------------------------------------------
STEPS_PER_EPOCH = 24  # the tiny chat job: 48 conversations, 2 a micro-batch
TOTAL = STEPS_PER_EPOCH + 4


def _constant_lr_job(folder: Path, **train) -> dict:
    """A constant LR, so that ``train.max_steps`` (free to change on resume) changes nothing else."""
    cfg = job(folder, **train)
    cfg["optim"] = {"lr": 1e-2, "warmup_ratio": 0.0, "min_lr_ratio": 1.0}
    return cfg


def _records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def _weights(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    return load_file(str(Path(summary["checkpoint"]) / "drafter.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full")
    train(config_from_dict(_constant_lr_job(folder, max_steps=TOTAL)), target=tiny_target(), echo=lambda *a: None)
    records = _records(folder / "run")
    assert [r["epoch"] for r in records] == [0] * STEPS_PER_EPOCH + [1] * 4  # the run crosses into epoch 1
    return records, _weights(folder / "run")


def _split_run(folder: Path, stop_at: int, before_resume=lambda: None) -> tuple[list[dict], dict]:
    train(config_from_dict(_constant_lr_job(folder, max_steps=stop_at)), target=tiny_target(), echo=lambda *a: None)
    before_resume()
    train(config_from_dict(_constant_lr_job(folder, max_steps=TOTAL, resume="auto")), target=tiny_target(),
          echo=lambda *a: None)
    return _records(folder / "run"), _weights(folder / "run")


def _assert_same_run(got, want) -> None:
    (records, weights), (ref_records, ref_weights) = got, want
    assert [r["step"] for r in records] == list(range(1, TOTAL + 1))
    assert [r["epoch"] for r in records] == [r["epoch"] for r in ref_records]
    torch.testing.assert_close(torch.tensor([r["loss"] for r in records]),
                               torch.tensor([r["loss"] for r in ref_records]), rtol=1e-5, atol=1e-6)
    for name, tensor in ref_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_across_an_epoch_boundary(tmp_path, uninterrupted):
    """Stopped two steps into epoch 1, resumed: the same micro-batches (epoch 1's order), the same
    anchors (drawn per epoch), the same weights as the run that never stopped."""
    got = _split_run(tmp_path, STEPS_PER_EPOCH + 2)
    state = json.loads((complete_checkpoints(tmp_path / "run")[0] / "trainer_state.json").read_text())
    assert state["data"]["epoch"] == 1 and state["data"]["micro_batch"] == 2
    _assert_same_run(got, uninterrupted)


def test_resume_needs_no_global_rng_state(tmp_path, uninterrupted):
    """No RNG state is saved: a resume in a process whose global generators (Python, NumPy,
    torch) are anywhere else still equals the uninterrupted run. A step that drew from one
    (dropout, an unseeded shuffle) would fail here and need its state saved."""

    def scramble() -> None:
        random.seed(1234)
        np.random.seed(1234)
        torch.manual_seed(1234)
        random.random(), np.random.rand(), torch.rand(3)

    _assert_same_run(_split_run(tmp_path, 5, scramble), uninterrupted)


# -- accumulation ---------------------------------------------------------------------------------
def _micro_batch(ids: torch.Tensor, prompt: list[int], sample_ids: list[int]) -> MicroBatch:
    loss_mask = torch.ones_like(ids)
    for row, n in enumerate(prompt):
        loss_mask[row, :n] = 0
    return MicroBatch(ids, loss_mask, torch.ones_like(ids), torch.tensor(sample_ids), epoch=0)


def test_accumulated_micro_batches_equal_one_large_batch():
    """One step over two micro-batches (``train.grad_accum=2``) gives the gradient and loss of one
    pass over both as a single batch, computed plainly: sum(w * CE) / sum(w) and one backward.
    The micro-batches carry different loss weights, so averaging per micro-batch would differ."""
    torch.manual_seed(0)
    target = Target(tiny_qwen3(num_layers=4))
    drafter, _ = tiny_drafter(target, num_layers=1, block_size=4)
    ids = torch.randint(0, 100, (4, 40))
    first = _micro_batch(ids[:2], [4, 30], [0, 1])  # few positions carry a loss in row 1
    second = _micro_batch(ids[2:], [2, 3], [2, 3])
    both = _micro_batch(ids, [4, 30, 2, 3], [0, 1, 2, 3])
    layer_ids = drafter.config.target_layer_ids
    spec = StepSpec(4, drafter.config.mask_token_id, num_anchors=6, seed=3, attention="sdpa")

    def features(mb, input_ids, attention):
        return target.features(input_ids, attention, layer_ids)

    # the reference: a copy of the drafter, one forward and backward over the large batch
    reference = copy.deepcopy(drafter)
    opts = spec.options(torch.device("cpu"))
    step = build_train_step(spec, drafter, drafter, target, OptimConfig(grad_clip=0.0), 10, torch.device("cpu"),
                            torch.float32, RankInfo())
    anchors, keep = step.anchors(both)
    blocks = make_blocks(both.input_ids, both.loss_mask, anchors, keep, opts)
    out = drafter_loss(reference, target.embed_tokens, target.lm_head_weight,
                       features(both, both.input_ids, both.attention_mask), blocks, opts)
    loss = out.weighted_ce / blocks.weights.sum()
    loss.backward()
    want = {name: p.grad for name, p in reference.named_parameters()}
    assert all(first.loss_mask.sum(1) != second.loss_mask.sum(1))

    got = {}
    optimizer_step = step.optimizer.step

    def record_then_step(*args, **kwargs):
        got.update({name: p.grad.clone() for name, p in drafter.named_parameters()})
        return optimizer_step(*args, **kwargs)

    step.optimizer.step = record_then_step
    result = step([first, second], features, 1)
    torch.testing.assert_close(result.loss, loss.detach(), rtol=1e-5, atol=1e-7)
    assert set(got) == set(want)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7, msg=name)
