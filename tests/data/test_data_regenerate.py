"""regenerate: turn-by-turn replacement, resumable output, and a real SIGKILL-and-resume run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from data_helpers import REPO, SMOLLM2, write_jsonl

from dflash_train.data.errors import SkipReport
from dflash_train.data.readers import read_records
from dflash_train.data.regenerate import recover_output, run_regenerate
from dflash_train.decoding.generators import Generation, Generator, SamplingParams, split_reasoning


class EchoGenerator(Generator):
    """Answers with the number of messages it saw, so turn ordering is visible."""

    def __init__(self):
        self.calls: list[list[list[dict]]] = []

    def generate(self, prompts, params):
        self.calls.append(prompts)
        return [Generation(f"reply after {len(p)} ({p[-1]['content']})", None, 3) for p in prompts]


def rows(n: int) -> list:
    out = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "old"},
                                         {"role": "user", "content": "more"}, {"role": "assistant", "content": "old"}]}
           for i in range(n)]
    return out + ["{bad json"]


def run(path, out, gen, limit=None, batch_size=2):
    report = SkipReport()
    summary = run_regenerate(read_records([str(path)], report), gen, out, SamplingParams(8), batch_size, report,
                             limit=limit, progress=False)
    return summary, report


def test_turns_regenerated_in_order(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", rows(3))
    gen = EchoGenerator()
    summary, report = run(src, tmp_path / "out.jsonl", gen)
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == ["r0", "r1", "r2"] and summary.done == 3 and summary.new_tokens == 18
    assert lines[0]["messages"][1]["content"] == "reply after 1 (q0)"
    assert lines[0]["messages"][3]["content"] == "reply after 3 (more)"
    assert gen.calls[1][0][1]["content"] == "reply after 1 (q0)"  # later turns see regenerated ones
    assert report.skipped == {"malformed_json": 1} and report.read == report.kept + report.total_skipped


def test_resume_tolerates_partial_last_line_without_duplicates(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", rows(5))
    out = tmp_path / "out.jsonl"
    run(src, out, EchoGenerator(), limit=2)
    with open(out, "a") as fh:
        fh.write('{"id": "r2", "messa')  # killed mid-write
    assert recover_output(out) == {"r0", "r1"} and out.read_text().endswith("\n")
    gen = EchoGenerator()
    summary, _ = run(src, out, gen)
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    assert ids == ["r0", "r1", "r2", "r3", "r4"] and summary.already_done == 2 and summary.done == 3


def test_split_reasoning():
    assert split_reasoning("<think>\nhmm\n</think>\n\nAnswer") == ("Answer", "hmm")
    assert split_reasoning("Answer") == ("Answer", None)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dflash_train.data.cli", "regenerate", "--target", str(SMOLLM2), *args]


@pytest.mark.slow
def test_real_model_sigkill_and_resume(tmp_path):
    if not (SMOLLM2 / "model.safetensors").exists():
        pytest.skip("assets/smollm2 model missing")
    prompts = ["Name a color.", "Name a fruit.", "Name an animal.", "Name a city."]
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"p{i}", "prompt": p, "response": "-"}
                                              for i, p in enumerate(prompts)])
    out = tmp_path / "out.jsonl"
    args = _cli("--data", str(src), "--out", str(out), "--max-new-tokens", "6", "--batch-size", "1")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = out.read_text().splitlines()
    assert 1 <= len(first) < len(prompts)
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [f"p{i}" for i in range(len(prompts))]
    assert [r["id"] for r in records[: len(first)]] == [json.loads(x)["id"] for x in first]
    assert all(r["messages"][-1]["role"] == "assistant" and r["messages"][-1]["content"] != "-" for r in records)
    assert f"{len(prompts) - len(first)} records done, {len(first)} already in output" in done.stdout
