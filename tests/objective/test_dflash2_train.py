"""A DFlash2 drafter trains on CPU through the ordinary trainer: it learns and resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from testkit import tiny_chat_job, tiny_chat_target, train_stopped_then_resumed

from dflash_train.config import config_from_dict
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
DFLASH2 = {"kind": "dflash2", "options": {"conv_group_size": 16, "selector_rank": 16, "selector_top_k": 8}}


def _job(tmp_path, **train):
    job = tiny_chat_job(tmp_path, **train)
    job["drafter"].update(DFLASH2)
    return job


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_dflash2_learns_and_resumes_exactly(tmp_path):
    full = tmp_path / "full"
    summary = train(config_from_dict(_job(full, max_steps=16)), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    curve = _losses(full / "run")
    assert len(curve) == 16 and summary["steps"] == 16
    assert sum(curve[-4:]) / 4 < 0.8 * sum(curve[:4]) / 4, curve
    resolved = json.loads((full / "run" / "config.json").read_text())["drafter_resolved"]
    assert resolved["kind"] == "dflash2"

    split = tmp_path / "split"
    train_stopped_then_resumed(_job(split, max_steps=16), 8, lambda: tiny_chat_target(SMOLLM2))
    torch.testing.assert_close(torch.tensor(_losses(split / "run")), torch.tensor(curve), rtol=1e-5, atol=1e-6)
