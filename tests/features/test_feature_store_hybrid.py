"""The hybrid mode (``train.feature_cache=disk``, issue 58 item 4): online in the first epoch while
writing the store, then from it. Its losses equal online training's step for step (``auto`` encoding),
the store it leaves is the store ``dflash-train features`` writes (conversation by conversation), and a
run resumed inside the first epoch, having lost its unflushed shard, completes the store at the switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_feature_store import SMOLLM2, _dump, _job, _per_sample, _train
from testkit import tiny_chat_target

from dflash_train.config import config_from_dict
from dflash_train.features.hybrid import HybridFeatures
from dflash_train.features.reader import FeatureStore

EPOCH, STEPS = 24, 30  # the tiny job's epoch is 24 steps: 6 steps of the second read the store


def _hybrid(tmp_path, name: str, store: Path, **overrides) -> dict:
    return _job(tmp_path, name, max_steps=STEPS, feature_cache="disk", feature_store=str(store), **overrides)


def test_hybrid_trains_like_online_and_leaves_the_store_features_writes(tmp_path):
    want, _ = _train(_job(tmp_path, "online", max_steps=STEPS))
    got, summary = _train(_hybrid(tmp_path, "hybrid", tmp_path / "hstore"))
    assert len(got) == STEPS and got == want
    report = summary["feature_store"]
    assert report["mode"] == "hybrid" and report["complete"] and report["completed_tokens"] == 0
    assert report["written_tokens"] == FeatureStore(tmp_path / "hstore").manifest["tokens"]
    assert report["micro_batches"] == STEPS - EPOCH  # the second epoch reads the store
    _dump(_job(tmp_path, "dumped"), tmp_path / "dstore")
    assert _per_sample(tmp_path / "hstore") == _per_sample(tmp_path / "dstore")


def test_a_complete_store_is_read_from_the_first_step(tmp_path):
    _train(_hybrid(tmp_path, "first", tmp_path / "store"))
    again, summary = _train(_hybrid(tmp_path, "second", tmp_path / "store"))
    first, _ = _train(_job(tmp_path, "online", max_steps=STEPS))
    assert again == first
    assert summary["feature_store"]["written_tokens"] == 0 and summary["feature_store"]["micro_batches"] == STEPS


def test_a_resumed_run_that_lost_its_unflushed_shard_completes_the_store(tmp_path, monkeypatch):
    """Stopped at step 5 without flushing (as a SIGKILL leaves it), resumed: the switch writes the lost
    micro-batches with the target, and the losses still equal an uninterrupted run's."""
    from testkit import train_stopped_then_resumed

    whole, _ = _train(_hybrid(tmp_path, "whole", tmp_path / "wstore"))
    flush = HybridFeatures.finish
    calls = []

    def killed_finish(self):  # the first run's end loses what it had not flushed
        calls.append(1)
        if len(calls) == 1:
            self.writer.parts, self.writer.samples, self.writer.micro_batches = [], [], []
        flush(self)

    monkeypatch.setattr(HybridFeatures, "finish", killed_finish)
    job = _hybrid(tmp_path, "resumed", tmp_path / "rstore", save_every_steps=0)
    train_stopped_then_resumed(job, 5, lambda: tiny_chat_target(SMOLLM2))
    rows = [json.loads(line) for line in (tmp_path / "resumed" / "run" / "metrics.jsonl").read_text().splitlines()]
    resumed = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert [resumed[s] for s in sorted(resumed)] == whole and len(calls) == 2
    assert _per_sample(tmp_path / "rstore") == _per_sample(tmp_path / "wstore")


def test_hybrid_options_are_checked_in_one_line():
    from dflash_train.config import load_config

    hybrid = ["train.feature_cache=disk", "train.feature_store=stores/x"]
    cfg = load_config("cpu-demo", [*hybrid, "train.feature_store_dtype=float8"])
    assert cfg.train.loads_target_layers and cfg.train.feature_store_dtype == "float8"
    assert load_config("cpu-demo", [*hybrid, "train.drafter_init=target"]).train.feature_cache == "disk"
    for overrides, match in ((["train.feature_cache=disk"], "name its folder with train.feature_store"),
                             (["train.feature_store_dtype=float8"], "no use with feature_cache=off"),
                             ([*hybrid, "train.feature_store_dtype=fp4"], "auto, bfloat16 or float8")):
        with pytest.raises(ValueError, match=match):
            load_config("cpu-demo", overrides)
    assert not config_from_dict(_store_only()).train.loads_target_layers


def _store_only() -> dict:
    from dflash_train.config import load_config

    return load_config("cpu-demo", ["train.feature_store=stores/x", "eval.prompts=null"]).to_dict()


def test_a_fp8_hybrid_store_trains_within_tolerance(tmp_path):
    want, _ = _train(_job(tmp_path, "online", max_steps=STEPS))
    got, summary = _train(_hybrid(tmp_path, "hybrid", tmp_path / "store", feature_store_dtype="float8"))
    assert got[:EPOCH] == want[:EPOCH] and got != want  # the first epoch is online, the second reads FP8
    assert max(abs(a - b) / abs(b) for a, b in zip(got, want)) < 0.02
    assert FeatureStore(tmp_path / "store").encoding["dtype"] == "float8" and summary["feature_store"]["complete"]
