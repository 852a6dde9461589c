"""train.distill end to end: a tiny CPU training with soft targets, the config's range, and the
topologies that cannot feed it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict, load_config
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


def run_counting_last_layer(tmp_path: Path, **overrides) -> tuple[list[float], int]:
    """Per-step losses, and how often the target's last decoder layer ran."""
    target = tiny_chat_target(SMOLLM2)
    calls = []
    target.layers[-1].register_forward_hook(lambda *_: calls.append(1))
    train(config_from_dict(tiny_chat_job(tmp_path, **overrides)), target=target, echo=lambda *a: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r], len(calls)


def test_tiny_training_with_distill_runs_and_learns(tmp_path):
    soft, soft_calls = run_counting_last_layer(tmp_path / "soft", max_steps=12, distill=0.5)
    hard, hard_calls = run_counting_last_layer(tmp_path / "hard", max_steps=1)
    assert len(soft) == 12 and all(math.isfinite(x) for x in soft), soft
    assert sum(soft[-3:]) < sum(soft[:3]), soft
    assert soft[0] != pytest.approx(hard[0], rel=1e-4)  # the soft targets reach the loss
    # distill runs the whole target (the soft targets need its logits); the default path does not
    assert soft_calls >= 12 and hard_calls == 0


def test_distill_config_range_and_colocated_only(tmp_path):
    for bad in ("-0.1", "1.5"):
        with pytest.raises(ValueError, match=r"train\.distill must be in \[0, 1\]"):
            load_config("cpu-demo", [f"train.distill={bad}"])
    assert load_config("cpu-demo", ["train.distill=1"]).train.distill == 1
    assert load_config("cpu-demo").train.distill == 0
    from dflash_train.distributed.launch import _run_disaggregated

    cfg = load_config("cpu-demo", ["train.distill=0.5"])
    with pytest.raises(ValueError, match="train.distill needs colocated training"):
        _run_disaggregated(cfg, None, None, None, None, print)  # refused before any rank work
    from dflash_train.distributed.plan import measure

    with pytest.raises(ValueError, match="train.distill needs colocated training"):
        measure(cfg)


def test_a_checkpoint_from_before_distill_resumes_only_without_it():
    from dflash_train.train.checkpoint import config_differences

    saved = {"train": {"max_steps": 4}}  # written before train.distill existed
    assert config_differences(saved, {"train": {"max_steps": 4, "distill": 0.0}}) == []
    assert config_differences(saved, {"train": {"max_steps": 4, "distill": 0.5}}) == [
        "train.distill: checkpoint 0.0 vs now 0.5"]
