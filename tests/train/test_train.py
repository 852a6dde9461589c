"""Single-process training: it learns, it is deterministic, it logs, it resumes exactly."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_chat_target, train_stopped_then_resumed

from dflash_train.config import config_from_dict, load_config
from dflash_train.models.target import Target
from dflash_train.run_folder import complete_checkpoints, latest_checkpoint
from dflash_train.train.loop import train

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "assets" / "smollm2"

# torch.distributed.checkpoint logs a DEBUG event per tensor per save/load to its "c10d-*"
# loggers; under a failing test pytest would print hundreds of them. INFO hides them.
for _name in list(logging.root.manager.loggerDict):
    if _name.startswith("c10d-"):
        logging.getLogger(_name).setLevel(logging.INFO)


def tiny_target() -> Target:
    return tiny_chat_target(SMOLLM2)


def job(tmp_path: Path, **train_overrides) -> dict:
    return tiny_chat_job(tmp_path, **train_overrides)


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_training_learns_logs_and_is_deterministic(tmp_path):
    cfg = config_from_dict(job(tmp_path / "a", max_steps=24))
    summary = train(cfg, target=tiny_target(), echo=lambda *a: None)
    run = tmp_path / "a" / "run"
    curve = losses(run)
    assert len(curve) == 24 and summary["steps"] == 24
    assert sum(curve[-4:]) / 4 < 0.8 * sum(curve[:4]) / 4, curve
    assert summary["last_expected_acceptance"] > summary["first_expected_acceptance"]
    assert (run / "config.json").exists() and any((run / "tensorboard").iterdir())
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"loss", "accuracy", "expected_acceptance", "lr", "tokens_per_s"} <= set(record)
    resolved = json.loads((run / "config.json").read_text())["drafter_resolved"]
    assert resolved["mask_token_id"] is not None and len(resolved["target_layer_ids"]) == 2
    train(config_from_dict(job(tmp_path / "b", max_steps=24)), target=tiny_target(), echo=lambda *a: None)
    assert losses(tmp_path / "b" / "run") == curve  # seeded and deterministic on CPU


def test_exact_resume_mid_epoch(tmp_path):
    """N steps + stop + resume for N more == 2N uninterrupted steps (per-step losses)."""
    full_dir, split_dir = tmp_path / "full", tmp_path / "split"
    train(config_from_dict(job(full_dir, max_steps=10)), target=tiny_target(), echo=lambda *a: None)
    reference = losses(full_dir / "run")
    first = job(split_dir, max_steps=10)
    # stop after 5 steps the way a SIGTERM would (the loop saves and ends early), then resume
    train_stopped_then_resumed(first, 5, tiny_target)
    assert any(c.name.endswith("05") for c in complete_checkpoints(split_dir / "run"))  # the stop saved
    got = losses(split_dir / "run")
    assert len(got) == 10
    torch.testing.assert_close(torch.tensor(got), torch.tensor(reference), rtol=1e-5, atol=1e-6)


def test_resume_refuses_a_different_drafter(tmp_path):
    train(config_from_dict(job(tmp_path, max_steps=2)), target=tiny_target(), echo=lambda *a: None)
    other = job(tmp_path, max_steps=4, resume="auto")
    other["drafter"]["num_hidden_layers"] = 2
    with pytest.raises(ValueError, match="num_hidden_layers"):
        train(config_from_dict(other), target=tiny_target(), echo=lambda *a: None)


def test_config_errors_say_what_to_fix(tmp_path):
    with pytest.raises(ValueError, match="unknown key"):
        config_from_dict({"train": {"max_stepz": 3}})
    with pytest.raises(ValueError, match="unknown config section"):
        config_from_dict({"trian": {}})
    with pytest.raises(ValueError, match="override"):
        load_config("cpu-demo", ["max_steps=3"])
    with pytest.raises(ValueError, match="anchors"):
        load_config("cpu-demo", ["train.anchors=sometimes"])
    with pytest.raises(ValueError, match="flex"):
        load_config("cpu-demo", ["train.attention=flex"])
    for recipe in ("cpu-demo", "smollm2-1gpu", "qwen3-8b"):
        assert load_config(recipe).drafter.num_hidden_layers >= 1
    # YAML 1.1 reads 1e-3 (no dot) as text: numeric fields take it as the number it means
    cfg = load_config("cpu-demo", ["optim.lr=1e-3", "train.max_steps=2e2", "eval.every_minutes=1"])
    assert cfg.optim.lr == 1e-3 and cfg.train.max_steps == 200 and isinstance(cfg.train.max_steps, int)
    with pytest.raises(ValueError, match=r"optim\.lr must be a number, got 'fast'"):
        load_config("cpu-demo", ["optim.lr=fast"])
    for bad, message in (("train.max_steps=1.5", "whole number"), ("optim.lr=.nan", "finite"),
                         ("train.max_steps=true", "must be a number"), ("optim.lr=[1]", "must be a number")):
        with pytest.raises(ValueError, match=message):
            load_config("cpu-demo", [bad])
    assert load_config("cpu-demo", ["train.max_steps=12345678901234567891"]).train.max_steps == 12345678901234567891
    with pytest.raises(ValueError, match="time_budget_minutes"):
        load_config("cpu-demo", ["train.time_budget_minutes=-1"])



def test_heldout_tau_is_logged_once_per_step_when_a_periodic_evaluation_falls_on_the_last(tmp_path):
    cfg = job(tmp_path, max_steps=4)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Tell me story 3.\n")
    cfg["eval"] = {"prompts": str(prompts), "num_prompts": 1, "max_new_tokens": 4, "every": 2}
    summary = train(config_from_dict(cfg), target=tiny_target(), echo=lambda *a: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    taus = [(r["step"], r["tau"]) for r in rows if "tau" in r]
    assert [step for step, _ in taus] == [0, 2, 4]  # before, periodic, and the last step's once (not 4, 4)
    assert summary["tau_after"] == taus[-1][1]


SCRIPT = """
import json, sys, time
sys.path[:0] = [{tests!r}, {kit!r}]
from test_train import job, tiny_target
from dflash_train.config import config_from_dict
from dflash_train.train import checkpoint
from dflash_train.train.loop import train
from pathlib import Path
mode = sys.argv[1]
cfg = job(Path({tmp!r}), max_steps=400, save_every_steps=3, keep_last=5)
if mode == "slow-save":
    original = checkpoint.save_file
    calls = []
    def slow(*a, **k):
        calls.append(1)
        original(*a, **k)
        if len(calls) == 2:
            print("SAVING", flush=True)
            time.sleep(60)
    checkpoint.save_file = slow
if mode == "slow-final-save":  # no periodic saves: the first save is the final one
    cfg = job(Path({tmp!r}), max_steps=5, keep_last=5)
    original = checkpoint.save_file
    def slow(*a, **k):
        print("SAVING", flush=True)
        time.sleep(5)
        original(*a, **k)
    checkpoint.save_file = slow
def echo(*a):
    print(*a, flush=True)
train(config_from_dict(cfg), target=tiny_target(), echo=echo)
print("EXITED", flush=True)
"""


def _spawn(tmp_path: Path, mode: str) -> subprocess.Popen:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(tests=str(REPO / "tests" / "train"), kit=str(REPO / "tests"), tmp=str(tmp_path)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


def _wait_for(proc: subprocess.Popen, marker: str, timeout: float = 120) -> str:
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    proc.kill()
    raise AssertionError(f"never saw {marker!r}:\n" + "".join(seen[-30:]))


def test_sigterm_finishes_the_step_saves_and_exits_zero(tmp_path):
    proc = _spawn(tmp_path, "plain")
    _wait_for(proc, "step 4 |")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "EXITED" in out
    newest = latest_checkpoint(tmp_path / "run")
    state = json.loads((newest / "trainer_state.json").read_text())
    assert state["counters"]["step"] >= 4 and newest.name.endswith(f"{state['counters']['step']:08d}")


def test_sigterm_during_the_final_save_lets_it_finish(tmp_path):
    """A wall-clock limit that sends SIGTERM while the last checkpoint is being written (seen on the
    H200: a run's time budget ended, then the command's own limit) must not kill the save."""
    proc = _spawn(tmp_path, "slow-final-save")
    _wait_for(proc, "SAVING")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "finishing the final save" in out and "EXITED" in out
    run = tmp_path / "run"
    assert [p.name for p in complete_checkpoints(run)] == ["step-00000005"]
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert json.loads((run / "summary.json").read_text())["steps"] == 5


def test_sigkill_while_saving_leaves_previous_checkpoint(tmp_path):
    proc = _spawn(tmp_path, "slow-save")
    _wait_for(proc, "SAVING")  # the second save (step 6) is half written
    proc.kill()
    proc.wait()
    run = tmp_path / "run"
    assert [p.name for p in complete_checkpoints(run)] == ["step-00000003"]
    assert (run / "checkpoints" / "step-00000006.tmp").exists()
    cfg = job(tmp_path, max_steps=5, resume="auto")
    summary = train(config_from_dict(cfg), target=tiny_target(), echo=lambda *a: None)
    assert summary["steps"] == 5  # resumed at 3, trained 2 more


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    train(config_from_dict(job(tmp_path, max_steps=2)), target=tiny_target(), echo=lambda *a: None)
    ckpt = latest_checkpoint(tmp_path / "run")
    shard = next((ckpt / "state").glob("*.safetensors"))
    intact = shard.read_bytes()
    shard.write_bytes(intact[:100])
    with pytest.raises(ValueError, match=r"corrupt or incomplete: state/.*has 100 bytes") as err:
        train(config_from_dict(job(tmp_path, max_steps=4, resume=str(ckpt))), target=tiny_target(),
              echo=lambda *a: None)
    assert "Traceback" not in str(err.value)
    shard.write_bytes(intact)
    (ckpt / "trainer_state.json").write_text("{not json")
    with pytest.raises(ValueError, match="trainer_state.json"):
        train(config_from_dict(job(tmp_path, max_steps=4, resume=str(ckpt))), target=tiny_target(),
              echo=lambda *a: None)


def test_time_budget_stops_and_completes_the_schedule(tmp_path):
    """train.time_budget_minutes: the run stops once the budget is spent (not at max_steps),
    the LR schedule has warmed up and decayed to its floor by then, and the stop is not an
    'early stop' (the checkpoint and summary are the normal end-of-run ones)."""
    budget_s = 1.5
    cfg = config_from_dict(job(tmp_path, max_steps=100_000, time_budget_minutes=budget_s / 60))
    cfg.optim.min_lr_ratio = 0.1
    # A fake clock: every reading is 0.125 s after the previous one, so each step is charged
    # exactly 0.125 s (one reading before it, one after), whatever the machine's speed.
    clock = itertools.count(0.0, 0.125).__next__
    summary = train(cfg, target=tiny_target(), echo=lambda *a: None, clock=clock)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    # the first (compiling) step is free, then 12 steps of 0.125 s spend the 1.5 s
    assert summary["steps"] == 13 and summary["stopped_early"] is False
    assert rows[-1]["step"] == summary["steps"]  # the last partial window is logged too
    lrs = [r["lr"] for r in rows]
    peak = cfg.optim.lr
    assert max(lrs) > 0.5 * peak  # warmed up (by time: warmup_ratio of the budget)
    assert lrs[-1] <= 0.15 * peak  # and decayed to ~min_lr_ratio by the end of the budget
    state = json.loads((Path(summary["checkpoint"]) / "trainer_state.json").read_text())
    assert state["counters"]["train_seconds"] >= budget_s  # saved: a resume continues the budget


def test_scheduler_follows_the_time_fraction():
    from dflash_train.config import OptimConfig
    from dflash_train.train.optim import build_scheduler, cosine_with_warmup

    spent = {"f": 0.0}
    cfg = OptimConfig(lr=1.0, warmup_ratio=0.1, min_lr_ratio=0.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, cfg, 1000, lambda: spent["f"])
    spent["f"] = 0.5  # half the time budget spent after 1 step: the schedule is half-way
    opt.step()
    sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(cosine_with_warmup(500, 1000, 100, 0.0))
    spent["f"] = 0.0  # the step count wins when it is further along
    for _ in range(700):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(cosine_with_warmup(701, 1000, 100, 0.0))


def test_every_steps_or_minutes_of_training_time():
    """The save/eval schedule: due on multiples of N steps, and each time the training clock
    crosses the next multiple of M minutes (once per crossing, however far it jumped)."""
    from types import SimpleNamespace

    from dflash_train.train.loop import Every

    def at(step, seconds):
        return SimpleNamespace(counters=SimpleNamespace(step=step, train_seconds=seconds))

    by_steps = Every(every_steps=3, every_minutes=0, train_seconds=0.0)
    assert [s for s in range(1, 10) if by_steps(at(s, 0.0))] == [3, 6, 9]
    by_time = Every(every_steps=0, every_minutes=1, train_seconds=30.0)  # resumed at 30 s: next at 90 s
    clock = [(1, 60.0), (2, 89.9), (3, 90.0), (4, 100.0), (5, 400.0), (6, 420.0), (7, 449.9), (8, 450.0)]
    assert [s for s, t in clock if by_time(at(s, t))] == [3, 5, 8]  # after 400 s the next is 450 s
    assert not Every(0, 0, 0.0)(at(5, 1e9))



def test_heldout_eval_adds_no_compiled_graphs(tmp_path):
    """Held-out decoding grows the drafter's context by a few tokens per step; run through
    the static-shape compiled layers it recompiled at every length until dynamo's limit
    (seen on the H200 in every in-training evaluation). Evaluation must add no graphs."""
    from types import SimpleNamespace

    from testkit import tiny_drafter
    from torch._dynamo.utils import counters

    from dflash_train.train.heldout import HeldoutEvaluator
    from dflash_train.train.parallelize import parallelize_drafter

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the capital of France?\nWrite a haiku about the sea.\n")
    target = tiny_target()
    drafter, _ = tiny_drafter(target, block_size=4)
    parallelize_drafter(drafter, activation_checkpointing=False, compile=True)
    torch._dynamo.reset()
    counters.clear()
    ids = torch.randint(0, 100, (1, 40))
    drafter(target.embed(ids[:, 36:]), target.features(ids[:, :36], None, drafter.config.target_layer_ids),
            torch.arange(36, 40)[None], torch.arange(36)[None])
    compiled = counters["stats"]["unique_graphs"]
    cfg = SimpleNamespace(prompts=str(prompts), num_prompts=2, max_new_tokens=24)
    trainer = SimpleNamespace(target=target, drafter=drafter, ranks=SimpleNamespace(is_main=True),
                              counters=SimpleNamespace(step=0), echo=lambda *a: None)
    tau = HeldoutEvaluator(cfg, target.tokenizer)(trainer)
    assert compiled > 0 and tau >= 1.0
    assert counters["stats"]["unique_graphs"] == compiled
