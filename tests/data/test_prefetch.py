"""The prefetching iterator (data/prefetch.py): the same steps in the same order, the position
of the last CONSUMED step in checkpoints, producer errors raised in the trainer, and a training
run equal to one without it."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict
from dflash_train.data.prefetch import PrefetchedBatches
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


class Counting:
    """A stand-in iterator: step k is [k]; its state is the number of steps taken."""

    def __init__(self, fail_at: int | None = None):
        self.taken, self.fail_at = 0, fail_at
        self.threads = set()

    def next_step(self):
        self.threads.add(threading.current_thread().name)
        if self.taken == self.fail_at:
            raise ValueError(f"bad record at step {self.taken}")
        self.taken += 1
        return [self.taken - 1]

    def state_dict(self):
        return {"taken": self.taken}

    def load_state_dict(self, state):
        self.taken = state["taken"]

    def steps_per_epoch(self):
        return 7


def test_same_steps_and_the_consumed_position():
    inner = Counting()
    batches = PrefetchedBatches(inner, depth=3)
    batches.load_state_dict({"taken": 5})  # a resume, before the first step
    assert batches.state_dict() == {"taken": 5}
    assert [batches.next_step() for _ in range(4)] == [[5], [6], [7], [8]]
    assert batches.state_dict() == {"taken": 9}  # the producer may be ahead: a checkpoint records what was consumed
    assert batches.steps_per_epoch() == 7  # other attributes: the wrapped iterator's
    assert inner.threads == {"dflash-prefetch"}
    with pytest.raises(RuntimeError, match="before the first step"):
        batches.load_state_dict({"taken": 0})
    batches.close()
    assert not batches.thread.is_alive()


def test_producer_errors_reach_the_trainer_in_order():
    batches = PrefetchedBatches(Counting(fail_at=2), depth=2)
    assert batches.next_step() == [0] and batches.next_step() == [1]
    with pytest.raises(ValueError, match="bad record at step 2"):
        batches.next_step()
    batches.close()


def test_prepare_runs_on_the_producer_thread():
    seen = []
    batches = PrefetchedBatches(Counting(), prepare=lambda item: seen.append((item, threading.current_thread().name)))
    batches.next_step()
    batches.close()
    assert seen[0] == (0, "dflash-prefetch")


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
def test_training_with_prefetch_equals_training_without(tmp_path, pack):
    curves = {}
    for steps in (0, 3):
        job = tiny_chat_job(tmp_path / str(steps), max_steps=12, feature_cache="cpu")
        job["data"].update(pack=pack, prefetch_steps=steps)
        train(config_from_dict(job), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
        curves[steps] = _losses(tmp_path / str(steps) / "run")
    assert len(curves[0]) == 12
    torch.testing.assert_close(torch.tensor(curves[3]), torch.tensor(curves[0]), rtol=0, atol=0)
