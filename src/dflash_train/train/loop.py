"""A whole training job: build, resume, train, checkpoint, evaluate, summarize.

The parallel layer (``dflash_train.distributed``) calls ``train`` with its rank layout,
feature source, timings and data parallelism; everything else is the same in one process
and in many.
"""

from __future__ import annotations

import time
from pathlib import Path

from dflash_train.config import JobConfig, TargetConfig
from dflash_train.data import DataConfig
from dflash_train.data.cache import rebuilt_entries
from dflash_train.data.readers import resolve_files
from dflash_train.devices import resolve_device
from dflash_train.files import atomic_write_text, seal_json, unwritable
from dflash_train.run_folder import CHECKPOINTS, CONFIG, SUMMARY
from dflash_train.run_lock import hold_run_folder
from dflash_train.tracking.base import SinkSettings, Tracking
from dflash_train.tracking.jsonl import read_metrics
from dflash_train.tracking.registry import open_tracking
from dflash_train.train.checkpoint import check_run_folder, resolve_resume
from dflash_train.train.compilation import FirstStep
from dflash_train.train.signals import StopOnSignals
from dflash_train.train.trainer import RankInfo, Trainer


class Every:
    """Due every N steps and/or every M minutes of TRAINING time (``counters.train_seconds``:
    evaluation and checkpoint time do not count, and ranks agree on it after every step, so
    every rank makes the same decision: checkpoints and evaluations are collective)."""

    def __init__(self, every_steps: int, every_minutes: float, train_seconds: float):
        self.every_steps = every_steps
        self.every_seconds = every_minutes * 60
        self.next_at = train_seconds + self.every_seconds

    def __call__(self, trainer: Trainer) -> bool:
        by_steps = self.every_steps > 0 and trainer.counters.step % self.every_steps == 0
        by_time = self.every_seconds > 0 and trainer.counters.train_seconds >= self.next_at
        while by_time and self.next_at <= trainer.counters.train_seconds:
            self.next_at += self.every_seconds
        return by_steps or by_time


RUN_DIR_TODO = "free space or set train.run_dir elsewhere"


def write_run_config(trainer: Trainer) -> None:
    if not trainer.ranks.is_main:
        return
    trainer.run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {**trainer.cfg.to_dict(), "drafter_resolved": trainer.drafter_cfg.to_dict()}
    atomic_write_text(trainer.run_dir / CONFIG, seal_json(resolved, indent=1), "run config", RUN_DIR_TODO)


def write_summary(run_dir: Path, summary: dict) -> None:
    """``summary.json``, atomically: a failed write leaves the previous one and is one line. It
    carries its checksum (``files.seal_json``): the pruning reads back the checkpoint it names."""
    atomic_write_text(Path(run_dir) / SUMMARY, seal_json(summary, indent=1), "run summary", RUN_DIR_TODO)


def tokenize_before_target(data: DataConfig, target: TargetConfig, block_size: int) -> None:
    """Tokenize the data set (into its cache) with the target's tokenizer alone, before the
    target's weights are loaded: a data set with nothing usable in it fails in seconds, with
    its skip report, not after minutes of loading; the trainer then reads the cache."""
    from dflash_train.data import load_tokenized
    from dflash_train.models.target import load_tokenizer

    load_tokenized(data, load_tokenizer(target.path, target.gguf_file), block_size)


def preflight(cfg: JobConfig, echo=print, tokenize: bool = False) -> Path | None:
    """What can be checked before the (slow) target load: the device exists, the data paths
    and eval prompts exist (with ``tokenize``, the data tokenizes to something usable), the run
    folder is writable and not another run's, the checkpoint to resume exists and verifies.
    Returns that checkpoint."""
    resolve_device(cfg.train.device)
    resolve_files(cfg.data.paths)
    if cfg.eval.prompts:
        from dflash_train.data.prompt_sets import resolve_prompts
        from dflash_train.data.prompts import read_prompts

        read_prompts(resolve_prompts(cfg.eval.prompts), limit=cfg.eval.num_prompts)
    run_dir = Path(cfg.train.run_dir)
    reason = unwritable(run_dir)
    if reason is not None:
        raise ValueError(f"train.run_dir {run_dir}: cannot write there ({reason})")
    if not cfg.train.loads_target_layers:  # a store missing or unfinished: one line before the target loads
        from dflash_train.features.reader import FeatureStore

        FeatureStore(cfg.train.feature_store)
    check_run_folder(run_dir, cfg.train.resume)
    resume = resolve_resume(cfg.train.resume, run_dir, echo)
    if tokenize:  # the slowest check, last
        tokenize_before_target(cfg.data, cfg.target, cfg.drafter.block_size)
    return resume


class StepEnd:
    """What runs after every step (``Trainer.run``'s ``on_step_end``): the first step's compile
    report, periodic checkpoints and periodic held-out evaluations."""

    def __init__(self, trainer: Trainer, evaluator, summary: dict):
        t, e = trainer.cfg.train, trainer.cfg.eval
        self.evaluator, self.summary = evaluator, summary
        self.first = FirstStep(trainer.run_dir, t.compile_artifacts, trainer.compiled, trainer.ranks.is_main,
                               trainer.echo)
        self.save_due = Every(t.save_every_steps, t.save_every_minutes, trainer.counters.train_seconds)
        self.eval_due = Every(e.every, e.every_minutes, trainer.counters.train_seconds)
        self.started = time.perf_counter()

    def __call__(self, t: Trainer) -> None:
        self.summary.update(self.first.done(time.perf_counter() - self.started))  # the first step only
        if self.save_due(t) and t.counters.step < t.total_steps:
            t.ranks.expect_long("saving a checkpoint")
            t.save_checkpoint()
        if self.evaluator is not None and self.eval_due(t) and not t.stop_requested:
            t.ranks.expect_long("held-out evaluation")
            heldout_tau(t, self.evaluator)  # (a stopping run: once, after its last step, in ``_finish``)


def train(cfg: JobConfig, target=None, ranks: RankInfo | None = None, echo=print, clock=time.monotonic,
          **parts) -> dict:
    """``_train`` holding the run folder (the main rank; ``run_lock.py``): one run per folder."""
    with hold_run_folder(cfg.train.run_dir, enabled=ranks is None or ranks.is_main, echo=echo):
        return _train(cfg, target, ranks, echo, clock, **parts)


def _train(cfg: JobConfig, target=None, ranks: RankInfo | None = None, echo=print, clock=time.monotonic,
           **parts) -> dict:
    """Run one training job and return its summary (also written to ``summary.json``).

    ``ranks`` and ``parts`` (``features``, ``timings``, ``data_parallel``) are what the
    distributed layer passes to the ``Trainer`` (see its docstring). ``clock`` times the
    steps for ``train.time_budget_minutes`` (tests pass a fake one). The main rank opens the
    sinks of ``train.loggers`` before the target loads (one that cannot start is one line);
    they are closed however the job ends.
    """
    is_main = ranks is None or ranks.is_main
    rebuilt_before = rebuilt_entries()
    # a target passed in (the distributed layer, tests) was loaded already: nothing to gain
    resume = preflight(cfg, echo if is_main else (lambda *a, **k: None), tokenize=target is None)
    tracking = Tracking()  # other ranks log nowhere
    if is_main:
        tracking = open_tracking(SinkSettings.of_job(cfg, resuming=resume is not None), warn=echo)
    try:
        trainer = Trainer(cfg, target=target, ranks=ranks, echo=echo, clock=clock, tracking=tracking, **parts)
        write_run_config(trainer)
        if resume is not None:
            trainer.checkpoints.load(resume)
            trainer.echo(f"resumed from {resume} at step {trainer.counters.step}")
        tracking.rewind(trainer.counters.step if resume is not None else -1)
        earlier = [r for r in read_metrics(trainer.run_dir) if "loss" in r] if is_main else []
        evaluator = make_evaluator(trainer)
        summary = {}
        if evaluator is not None and cfg.eval.at_start and trainer.counters.step == 0:
            summary["tau_before"] = heldout_tau(trainer, evaluator)
        result = trainer.run(StepEnd(trainer, evaluator, summary))
        trainer.ranks.expect_long("saving the final checkpoint, final evaluation")
        final = _finish(trainer, result, earlier, evaluator, summary, rebuilt_entries() - rebuilt_before)
    finally:
        tracking.close()
    if result["stopped_early"]:
        trainer.echo(f"stopped at step {trainer.counters.step} of {trainer.total_steps}: checkpoint {final}; "
                     f"continue with the same config and train.resume=auto")
    return summary


def _finish(trainer: Trainer, result: dict, earlier: list[dict], evaluator, summary: dict,
            cache_rebuilt: int = 0) -> Path:
    """The final checkpoint, evaluation and ``summary.json``; returns the checkpoint. A signal here
    lets what is in flight finish and skips the final evaluation: the run's policy holds to the end.
    ``cache_rebuilt``: the corrupt data-cache entries rebuilt during the run (said at the end)."""
    late: list[str] = []

    def finish_in_flight(name: str) -> None:
        late.append(name)
        trainer.echo(f"signal {name}: finishing the final save and summary")

    with StopOnSignals(finish_in_flight):
        trainer.echo(f"step {trainer.counters.step} | saving the final checkpoint in {trainer.run_dir / CHECKPOINTS}")
        final = trainer.save_checkpoint()
        summary.update(_curve_summary(earlier + result["history"]))
        summary.update(steps=trainer.counters.step, checkpoint=str(final), stopped_early=result["stopped_early"])
        if trainer.counters.bad_steps:
            summary["bad_steps"] = trainer.counters.bad_steps
        if cache_rebuilt:
            summary["cache_entries_rebuilt"] = cache_rebuilt
            trainer.echo(f"data cache: {cache_rebuilt} corrupt entr{'y' if cache_rebuilt == 1 else 'ies'} rebuilt "
                         f"during this run (their bytes had changed; see the notes above)")
        summary.update(result.get("sources", {}))  # the feature cache's or store's report
        if evaluator is not None and not result["stopped_early"] and not late:
            summary["tau_after"] = heldout_tau(trainer, evaluator)
        trainer.tracking.close()
        if trainer.ranks.is_main:
            write_summary(trainer.run_dir, summary)
            trainer.checkpoints.prune()  # the checkpoint the old summary named may go now
    return final


def _curve_summary(history: list[dict]) -> dict:
    if not history:
        return {}
    first, last = history[0], history[-1]
    out = {"first_loss": first["loss"], "last_loss": last["loss"]}
    if "expected_acceptance" in first:
        out["first_expected_acceptance"] = first["expected_acceptance"]
        out["last_expected_acceptance"] = last["expected_acceptance"]
    return out


def heldout_tau(trainer: Trainer, evaluator) -> float | None:
    """Held-out tau at the trainer's step (None on other ranks than the main one), logged as a
    record of its own, ``{"tau": ...}``, next to the training records. Once per step: when a
    periodic evaluation falls on the last step, the final evaluation is that one (same weights)."""
    step = trainer.counters.step
    if evaluator.evaluated is not None and evaluator.evaluated[0] == step:
        return evaluator.evaluated[1]
    tau = evaluator(trainer)
    evaluator.evaluated = (step, tau)
    if tau is not None:
        trainer.tracking.log(trainer.counters.step, {"tau": tau})
    return tau


def make_evaluator(trainer: Trainer):
    """Held-out speculative decoding (real tau), logged next to the training metrics."""
    if not trainer.cfg.eval.prompts:
        return None
    from dflash_train.train.heldout import HeldoutEvaluator

    return HeldoutEvaluator(trainer.cfg.eval, trainer.target.tokenizer)
