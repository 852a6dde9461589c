"""Distributed training on CPU/gloo under torchrun: the same losses whatever the topology,
clean shutdown, a dead rank ends the job quickly, torchrun restarts resume."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_helpers import env, job, losses, metrics, save_tiny_target, tiny_target, torchrun_cmd, worker  # noqa: E402

from dflash_train.config import config_from_dict  # noqa: E402
from dflash_train.run_folder import complete_checkpoints, latest_checkpoint  # noqa: E402
from dflash_train.train.loop import train  # noqa: E402

STEPS = 6


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[float]:
    """One process, grad_accum=2: the global batch of 2 ranks x grad_accum 1."""
    folder = tmp_path_factory.mktemp("single")
    train(config_from_dict(job(folder, grad_accum=2, max_steps=STEPS)), target=tiny_target(), echo=lambda *a: None)
    curve = losses(folder / "run")
    assert len(curve) == STEPS
    return curve


def assert_clean(rc: int, out: str, err: str, ranks: int) -> None:
    assert rc == 0, err[-4000:]
    for bad in ("abort", "terminate called", "Traceback"):
        assert bad not in err and bad not in out, err[-4000:]
    assert out.count("EXITED rank") == ranks, out[-2000:]


def assert_same_losses(run: Path, reference: list[float]) -> None:
    got = losses(run)
    assert len(got) == len(reference)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(reference), rtol=1e-4, atol=1e-5)


def run_matching(tmp_path: Path, reference: list[float], ranks: int, *args: str, **env_extra) -> Path:
    """Run ``ranks`` workers, check a clean exit and the single-process losses; the run folder."""
    rc, out, err, _ = worker(ranks, tmp_path, *args, **env_extra)
    assert_clean(rc, out, err, ranks=ranks)
    run = tmp_path / "run"
    assert_same_losses(run, reference)
    return run


def target_log(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / f"target-rank{rank}.jsonl").read_text().splitlines()]


def test_colocated_two_ranks_match_one_process(tmp_path, reference):
    run = run_matching(tmp_path, reference, 2, "0", "0", "1", str(STEPS))
    record = metrics(run)[-1]
    assert record["target_forward_s"] > 0 and record["drafter_compute_s"] > 0
    assert latest_checkpoint(run).name.endswith(f"{STEPS:08d}")


def test_disaggregated_one_target_two_drafters_match_one_process(tmp_path, reference):
    run = run_matching(tmp_path, reference, 3, "1", "2", "1", str(STEPS))
    record = metrics(run)[-1]
    for key in ("drafter_compute_s", "drafter_recv_wait_s", "target_forward_s", "target_wait_s"):
        assert record[key] >= 0, key
    assert record["target_forward_s"] > 0
    assert sum(r["items"] for r in target_log(run, 2)) == 2 * STEPS  # every micro-batch of both drafters
    state = json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())
    assert state["counters"]["step"] == STEPS
    assert not (latest_checkpoint(run) / "rng").exists()  # no RNG state: nothing draws from a global generator


def test_disaggregated_two_targets_fsdp_drafters_match_one_process(tmp_path, reference):
    """1 target can feed 2 drafters; here 2 targets feed 1 drafter (grad_accum 2), round-robin."""
    run = run_matching(tmp_path, reference, 3, "2", "1", "2", str(STEPS))
    for rank in (1, 2):
        assert sum(r["items"] for r in target_log(run, rank)) == STEPS  # 12 micro-batches split evenly


def test_colocated_fsdp_matches_one_process(tmp_path, reference):
    run = run_matching(tmp_path, reference, 2, "0", "0", "1", str(STEPS), "train.fsdp_drafter=true",
                       "train.fsdp_target=true")
    from dflash_train.export.cli import read_training_artifact
    from dflash_train.export.serving import check_tensors

    cfg, weights, _ = read_training_artifact(latest_checkpoint(run))
    check_tensors(weights, cfg, "the checkpoint")  # whole tensors (their full shapes), not a rank's shards


def test_colocated_fsdp_drafter_init_from_target_matches_one_process(tmp_path, reference):
    """train.drafter_init=target with the target's layers sharded (FSDP2): gathered whole, the
    same start on every rank as in one process."""
    single = tmp_path / "single"
    train(config_from_dict(job(single, grad_accum=2, max_steps=STEPS, drafter_init="target")), target=tiny_target(),
          echo=lambda *a: None)
    from_target = losses(single / "run")
    assert from_target[0] != reference[0]  # the init changes the first loss: the match below is not trivial
    (tmp_path / "dist").mkdir()
    run_matching(tmp_path / "dist", from_target, 2, "0", "0", "1", str(STEPS), "train.fsdp_drafter=true",
                 "train.fsdp_target=true", "train.drafter_init=target")


def test_colocated_distill_matches_one_process(tmp_path, reference):
    """A kl target (the target's own distribution) through the colocated feature source
    (TimedFeatures over LocalFeatures), the target's layers sharded: the same losses as one process."""
    single = tmp_path / "single"
    config = job(single, grad_accum=2, max_steps=STEPS)
    config["objective"]["targets"] = {"ce": 0.5, "kl": 0.5}
    train(config_from_dict(config), target=tiny_target(), echo=lambda *a: None)
    soft = losses(single / "run")
    assert soft[0] != reference[0]  # the soft targets change the first loss: the match below is not trivial
    (tmp_path / "dist").mkdir()
    run_matching(tmp_path / "dist", soft, 2, "0", "0", "1", str(STEPS), "train.fsdp_target=true",
                 "objective.targets={ce: 0.5, kl: 0.5}")


def test_killed_rank_ends_the_job_quickly_and_names_it(tmp_path):
    rc, out, err, seconds = worker(3, tmp_path, "1", "2", "1", "200", CRASH="2:4:kill")
    assert rc != 0
    assert seconds < 90
    assert "Root Cause" in err and "rank      : 2" in err and "SIGKILL" in err, err[-3000:]


def test_killed_drafter_rank_colocated(tmp_path):
    rc, out, err, seconds = worker(2, tmp_path, "0", "0", "1", "200", CRASH="1:3:exit")
    assert rc != 0 and seconds < 90
    assert "rank      : 1" in err and "exitcode  : 3" in err, err[-3000:]


def test_restart_resumes_from_newest_checkpoint(tmp_path, reference):
    """Drafter rank 1 crashes once at step 5; torchrun restarts all ranks; they resume at step 4."""
    marker = tmp_path / "crashed-once"
    rc, out, err, _ = worker(3, tmp_path, "1", "2", "1", str(STEPS), "train.save_every_steps=2",
                             max_restarts=1, CRASH=f"1:5:exit:{marker}")
    assert marker.exists()
    assert rc == 0, err[-4000:]
    assert "resuming from the newest checkpoint" in out + err
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS
    steps = [r["step"] for r in metrics(run) if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # step 5 redone and logged once (the resume drops its first row)
    assert_same_losses(run, reference)
    assert complete_checkpoints(run)[-1].name.endswith(f"{STEPS:08d}")


def test_sigint_to_torchrun_stops_all_ranks_cleanly(tmp_path):
    """``dflash-train train`` under torchrun (the same command as one process); Ctrl-C to torchrun:
    every rank finishes the same step, the checkpoint is saved, every worker exits 0."""
    model = save_tiny_target(tmp_path / "target")
    cfg = job(tmp_path, max_steps=400, save_every_steps=0)
    cfg["target"]["path"] = str(model)
    (tmp_path / "job.json").write_text(json.dumps(cfg))
    cli = [str(Path(sys.executable).parent / "dflash-train"), "train", str(tmp_path / "job.json")]
    cmd = torchrun_cmd(2, "--no-python", *cli)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    seen, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if "step 3 |" in line or (not line and proc.poll() is not None):
            break
    assert any("step 3 |" in line for line in seen), "".join(seen[-30:])
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(seen) + rest
    assert time.monotonic() - start < 45
    # torchrun itself reports the signal (SignalException); no worker may fail or be killed
    assert "[rank0]" not in output and "[rank1]" not in output and "KeyboardInterrupt" not in output, output[-4000:]
    assert "exitcode  : -9" not in output  # nobody had to be killed
    newest = latest_checkpoint(tmp_path / "run")
    step = json.loads((newest / "trainer_state.json").read_text())["counters"]["step"]
    assert 3 <= step < 400
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped_early"] and summary["steps"] == step


def test_time_budget_is_agreed_by_ranks_with_different_speeds(tmp_path):
    """train.time_budget_minutes under 2 colocated ranks, one slower: the ranks share one clock
    (the max), so they use the same LR at every step, evaluate-or-not and stop at the same step."""
    rc, out, err, _ = worker(2, tmp_path, "0", "0", "1", "100000", "train.time_budget_minutes=0.04",
                             SLOW="1:0.05")
    assert_clean(rc, out, err, ranks=2)
    clocks = {}
    for rank, step, lr, seconds in re.findall(r"CLOCK rank (\d+) step (\d+) lr ([-+.e\d]+) seconds ([-+.e\d]+)", out):
        clocks.setdefault(int(step), {})[int(rank)] = (float(lr), float(seconds))
    assert len(clocks) > 2
    for step, by_rank in clocks.items():
        assert by_rank[0] == by_rank[1], (step, by_rank)  # same LR and same clock on both ranks
    exited = dict(re.findall(r"EXITED rank (\d+) steps (\d+)", out))
    assert len(set(exited.values())) == 1  # both stopped after the same step
    assert int(exited["0"]) < 100000


@pytest.mark.parametrize(("targets", "drafters", "accum"), [("1", "1", "2"), ("1", "2", "1"), ("0", "0", "1")],
                         ids=["1+1", "1+2", "colocated"])
def test_groups_follow_the_eager_nccl_split_rule(tmp_path, reference, targets, drafters, accum):
    """The disaggregated job hung on its first GPU run: the target rank waited forever in
    ``new_group`` (an NCCL communicator split the drafter never joined). With torch's NCCL
    splitting rule applied to gloo (``eager_split.py``) every topology must still train and
    match one process; on the old code the 1+1 and 1+2 cases fail with the rule's message."""
    ranks = 2 if targets == "0" else int(targets) + int(drafters)
    run_matching(tmp_path, reference, ranks, targets, drafters, accum, str(STEPS), EMULATE_EAGER_NCCL="1")


@pytest.mark.parametrize(("targets", "drafters", "hung"), [("1", "1", 0), ("0", "0", 1)],
                         ids=["disaggregated", "colocated"])
def test_watchdog_names_the_hung_rank_and_prints_every_rank_stack(tmp_path, targets, drafters, hung):
    """A rank that stops making progress (here: sleeps forever at step 3) must not hang the job:
    every rank's watchdog prints which rank stopped, its last phase and its Python stacks, and
    the job fails in bounded time (not after the 120 s collective timeout)."""
    rc, out, err, seconds = worker(2, tmp_path, targets, drafters, "1", "200", HANG=f"{hung}:3",
                                   DFLASH_WATCHDOG_SECONDS="4", DFLASH_DIST_TIMEOUT="120")
    text = out + err
    assert rc != 0
    assert seconds < 60, seconds
    assert f"HANGING rank {hung}" in text
    for rank in (0, 1):  # the hung rank and the peer waiting for it both say where they are
        assert f"watchdog: rank {rank} " in text, text[-3000:]
    assert "made no progress" in text and "last phase: after step 3" in text
    # the hung rank's stack, down to the sleeping frame, on a whole line of its own (both ranks dump
    # into the one stderr at about the same moment; the prefix keeps them apart)
    assert re.search(rf"^\[rank {hung}\] .* in hang_forever$", text, re.MULTILINE), text[-3000:]


def test_disaggregated_packed_rows_match_one_process(tmp_path):
    """data.pack: the target ranks build the same packed plan and keep conversations apart in
    their forward (per-conversation positions and mask), exactly as one process does."""
    single = tmp_path / "single"
    cfg = job(single, grad_accum=2, max_steps=4)
    cfg["data"]["pack"] = True
    train(config_from_dict(cfg), target=tiny_target(), echo=lambda *a: None)
    run_matching(tmp_path / "two", losses(single / "run"), 2, "1", "1", "2", "4", "data.pack=true")


def test_fsdp_restart_resumes_from_the_sharded_checkpoint(tmp_path, reference):
    """Colocated, drafter and target sharded (FSDP2): rank 1 crashes once at step 5, torchrun restarts
    both ranks, they load the step-4 checkpoint (DCP, every rank its shards of the weights and the
    optimizer state) and end on the single-process losses, the final weights whole tensors."""
    marker = tmp_path / "crashed-once"
    rc, out, err, _ = worker(2, tmp_path, "0", "0", "1", str(STEPS), "train.save_every_steps=2",
                             "train.fsdp_drafter=true", "train.fsdp_target=true",
                             max_restarts=1, CRASH=f"1:5:exit:{marker}")
    assert marker.exists()
    assert rc == 0, err[-4000:]
    assert "resuming from the newest checkpoint" in out + err
    run = tmp_path / "run"
    assert [r["step"] for r in metrics(run) if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert_same_losses(run, reference)
    assert latest_checkpoint(run).name.endswith(f"{STEPS:08d}")
    from dflash_train.export.cli import read_training_artifact
    from dflash_train.export.serving import check_tensors

    cfg, weights, _ = read_training_artifact(latest_checkpoint(run))
    check_tensors(weights, cfg, "the final checkpoint")  # every tensor whole: its full shape, not a rank's shard
