"""The random-kill soak, short (issue 60): five SIGKILLs aimed inside a data-cache write, a
checkpoint save, a metrics append, the summary's atomic write and a finished run's checkpoint
replacement, each followed by ``train.resume=auto``; the run must end bitwise equal to an
uninterrupted one (``soak.compare``), with no debris. The long soak (random moments, >= 20
kills) is ``python tests/faults/soak.py`` (docs/faults.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import soak

SHORT = ["cache-arrow:1", "checkpoint-shards:3", "metrics-append:2", "atomic-write:summary.json:1",
         "checkpoint-replace:1"]


def test_a_run_killed_inside_its_writes_and_resumed_ends_equal_to_an_uninterrupted_one(tmp_path, smollm2_path):
    report = soak.soak(tmp_path, [soak.Kill(aim) for aim in SHORT], steps=4, tokenizer=smollm2_path)
    assert [k["fell"] for k in report["kills"]] == [aim.rsplit(":", 1)[0] for aim in SHORT]
    assert report["landed"] == len(SHORT)
    assert report["differences"] == []
    # the comparison can fail: a duplicated metrics row and a changed counter are found
    metrics = tmp_path / "soak" / "metrics.jsonl"
    rows = metrics.read_text().splitlines()
    metrics.write_text("\n".join(rows[:2] + rows[1:]) + "\n")
    state = soak.latest_checkpoint_state(tmp_path / "soak")
    data = json.loads(state.read_text())
    data["data"]["micro_batch"] += 1
    state.write_text(json.dumps(data))
    found = soak.compare(tmp_path / "reference", tmp_path / "soak")
    assert any("metrics.jsonl steps differ" in d for d in found)
    assert any("trainer_state.json differs" in d for d in found)


def test_a_fault_point_kills_at_its_nth_visit_and_traces_every_visit(tmp_path):
    trace = tmp_path / "trace"
    code = ("from dflash_train.faultpoints import reached\n"
            "reached('save'); reached('write', 'a.json'); reached('save'); print('not reached')")
    env = {**os.environ, "DFLASH_KILL_AT": "save:2", "DFLASH_FAULT_TRACE": str(trace)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    assert "not reached" not in proc.stdout
    assert trace.read_text().split() == ["save", "write:a.json", "save"]
