"""Distillation targets end to end: a tiny CPU training towards the target's own distribution
(objective.targets kl / tv), the config's checks, and the topologies that cannot feed it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict, load_config
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


def run_counting_last_layer(tmp_path: Path, objective=None, **overrides) -> tuple[list[float], int]:
    """Per-step losses, and how often the target's last decoder layer ran."""
    target = tiny_chat_target(SMOLLM2)
    calls = []
    target.layers[-1].register_forward_hook(lambda *_: calls.append(1))
    train(config_from_dict(tiny_chat_job(tmp_path, objective, **overrides)), target=target, echo=lambda *a: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r], len(calls)


@pytest.mark.parametrize("targets", [{"ce": 0.5, "kl": 0.5}, {"ce": 0.1, "tv": 0.9}])
def test_tiny_training_towards_the_targets_distribution_runs_and_learns(tmp_path, targets):
    soft, soft_calls = run_counting_last_layer(tmp_path / "soft", {"targets": targets}, max_steps=12)
    hard, hard_calls = run_counting_last_layer(tmp_path / "hard", max_steps=12)
    assert len(soft) == 12 and all(math.isfinite(x) for x in soft)
    assert sum(soft[-3:]) / 3 < sum(soft[:3]) / 3  # it learns
    assert soft[0] != pytest.approx(hard[0], rel=1e-4)  # the target's distribution reaches the loss
    # kl/tv run the whole target (they need its logits); the default path does not
    assert soft_calls >= 12 and hard_calls == 0


def test_distribution_targets_are_colocated_only_and_exclude_the_feature_cache(tmp_path):
    cfg = load_config("cpu-demo", ["objective.targets={ce: 0.5, kl: 0.5}"])
    assert cfg.objective.needs_target_distribution
    from dflash_train.distributed.launch import _run_disaggregated
    from dflash_train.distributed.plan import measure

    with pytest.raises(ValueError, match="objective.targets kl/tv need colocated training"):
        _run_disaggregated(cfg, None, None, None, None, print)  # refused before any rank work
    with pytest.raises(ValueError, match="objective.targets kl/tv need colocated training"):
        measure(cfg)
    with pytest.raises(ValueError, match="train.feature_cache stores features only"):
        load_config("cpu-demo", ["objective.targets={tv: 1}", "train.feature_cache=device"])
    assert not load_config("cpu-demo").objective.needs_target_distribution
