"""One assembly (``train/assembly.py``): the trainer, a disaggregated target rank and the benchmark,
given one job config, build the same drafter config, the same drafter and the same step objective;
the benchmark times whatever the job's ``objective:`` and ``drafter:`` say."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.bench.job import BenchOptions, bench_job
from dflash_train.bench.run import StepBench, run_bench
from dflash_train.config import config_from_dict
from dflash_train.distributed.disagg import TargetServer, Topology
from dflash_train.train.trainer import Trainer

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"  # its tokenizer only
QUIET = dict(log=lambda *_: None)
OPTS = BenchOptions(seq_len=64, steps=1, warmup=1, profile_steps=0, device="cpu")


def test_trainer_target_server_and_bench_assemble_the_same_run(tmp_path):
    """DSpark with D-PACE, a loss-position cut and a chosen mask token: the three programs resolve one
    drafter config, init one drafter (same names, same weights: the seed before the CPU init) and run
    one objective; the target rank walks the trainer's micro-batches."""
    job = tiny_chat_job(tmp_path, objective={"weighting": "dpace", "dpace_alpha": 0.25, "loss_positions": 2},
                        seed=3)
    job["drafter"].update(kind="dspark", options={"markov_rank": 4})
    job["data"]["prefetch_steps"] = 0
    cfg = config_from_dict(job)
    cfg.validate()
    target = tiny_chat_target(SMOLLM2)
    trainer = Trainer(cfg, target=target, echo=lambda *a: None)
    server = TargetServer(target, Topology(2, 1, 1), 1, torch.device("cpu"), torch.device("cpu"), cfg,
                          echo=lambda *a: None)
    bench = StepBench.build(cfg, OPTS.resolved(cfg), 1, 0, QUIET["log"], target=target)
    assert trainer.drafter_cfg == server.drafter_cfg == bench.parts.drafter_cfg
    assert trainer.drafter_cfg.kind == "dspark" and trainer.drafter_cfg.options["markov_rank"] == 4
    assert trainer.step.opts == bench.step.opts
    assert bench.step.opts.objective.weighting == "dpace" and bench.step.opts.objective.dpace_alpha == 0.25
    ours, theirs = trainer.drafter.state_dict(), bench.parts.drafter.state_dict()
    assert list(ours) == list(theirs) and any("markov" in name for name in ours)
    for name, value in ours.items():
        torch.testing.assert_close(theirs[name], value, rtol=0, atol=0)
    assert [mb.sample_ids.tolist() for mb in server.batches.next_step()] == \
        [mb.sample_ids.tolist() for mb in trainer.batches.next_step()]


def test_bench_times_the_objective_and_kind_a_job_sets():
    """Overrides of ``objective.*`` and ``drafter.kind``: the timed step runs them (the step's options,
    the kind's heads in the drafter), and the loss moves with them after the same steps on the same rows."""
    base = ["train.num_anchors=8"]
    plain = run_bench(bench_job(None, base, "tiny"), OPTS, **QUIET)
    dspark = bench_job(None, [*base, "drafter.kind=dspark", "objective.weighting=dpace", "objective.dpace_alpha=0.1",
                              "objective.gamma=3"], "tiny")
    bench = StepBench.build(dspark, OPTS.resolved(dspark), 1, 0, QUIET["log"])
    assert bench.step.opts.objective.weighting == "dpace" and bench.step.opts.objective.dpace_alpha == 0.1
    assert bench.step.opts.gamma == 3
    assert any("markov" in name for name, _ in bench.parts.drafter.named_parameters())
    result = run_bench(dspark, OPTS, **QUIET)
    assert result["config"]["drafter"]["kind"] == "dspark" and result["config"]["objective"]["weighting"] == "dpace"
    assert result["config"]["bench"]["drafter_params"] > plain["config"]["bench"]["drafter_params"]
    assert math.isfinite(result["last_loss"]) and result["last_loss"] != pytest.approx(plain["last_loss"], rel=1e-4)


def test_flex_attention_off_cuda_is_refused_by_the_assembly():
    job = bench_job(None, ["train.num_anchors=8", "train.attention=flex"], "tiny")
    with pytest.raises(ValueError, match="train.attention=flex"):
        run_bench(job, OPTS, **QUIET)
