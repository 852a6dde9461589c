"""The training loop: builds target, drafter, data and optimizer, and runs the steps
(``train/step.py``) with the clock, the stop agreement, logging and signals around them.
The distributed layer passes its parts in (see ``Trainer``); nothing is patched afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from dflash_train.config import JobConfig
from dflash_train.data import MicroBatch
from dflash_train.data.prefetch import PrefetchedBatches
from dflash_train.devices import resolve_device
from dflash_train.files import explained
from dflash_train.models.target import Target
from dflash_train.run_folder import WRITE_TODO
from dflash_train.tracking.base import SinkSettings, Tracking
from dflash_train.tracking.registry import open_tracking
from dflash_train.train.assembly import assemble, load_data, load_target, target_dtype
from dflash_train.train.checkpoint import CheckpointManager
from dflash_train.train.features import LocalFeatures, SampleFeatureCache, replays_target_forward
from dflash_train.train.metrics import MetricWindow, format_record
from dflash_train.train.parallelize import DataParallel
from dflash_train.train.signals import StopOnSignals
from dflash_train.train.step import StepResult
from dflash_train.train.timings import Timings, format_timings


@dataclass
class Counters:
    """Progress that a checkpoint must restore (plain ints)."""

    step: int = 0  # optimizer steps done
    samples: int = 0  # sequences consumed (all ranks)
    tokens: int = 0  # context tokens consumed (all ranks)
    train_seconds: float = 0.0  # wall time inside training steps (for train.time_budget_minutes)
    bad_steps: int = 0  # steps skipped for a non-finite loss or gradient norm (train.max_bad_steps)

    def state_dict(self) -> dict:
        return vars(self).copy()

    def load_state_dict(self, state: dict) -> None:
        """In place: the checkpoint manager and the LR schedule's clock hold this object."""
        for name, value in state.items():
            if not hasattr(self, name):
                raise ValueError(f"checkpoint counters: unknown field {name!r}")
            setattr(self, name, value)


@dataclass
class RankInfo:
    """This process's place among the drafter ranks, and how they agree after every step."""

    rank: int = 0
    world: int = 1
    group: object = None  # process group of the drafter data-parallel ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def agree(self, step: int, stop: bool, signalled: bool, seconds: float) -> tuple[bool, bool, float]:
        """(stop, signalled, training seconds) as every rank will act on them after ``step``.
        One process: its own values. (``distributed.common.AgreedRanks``: the max over ranks.)"""
        return stop, signalled, seconds

    def expect_long(self, phase: str) -> None:
        """A phase that may take minutes is starting (a checkpoint, a held-out evaluation):
        nothing to do in one process; ``AgreedRanks`` relaxes its rank's watchdog."""


class NonFiniteError(ValueError):
    """More non-finite steps than ``train.max_bad_steps``: the run stops, unsaved."""


class Trainer:
    """Builds target, drafter, data, optimizer from a ``JobConfig`` and trains.

    ``clock`` (seconds, monotonic) times the steps charged to ``train.time_budget_minutes``;
    tests pass a fake one so time-dependent behaviour does not depend on the machine's speed.

    The distributed layer passes its parts in, nothing is patched afterwards: ``ranks`` (the
    rank layout and the per-step agreement on stopping and on the clock), ``features`` (a
    factory of the trainer returning its feature source, ``train/features.py``; default: the
    local target), ``timings`` (per-role seconds in the metrics) and ``data_parallel`` (DDP or
    FSDP2 over the drafter ranks, applied with compile and checkpointing before the optimizer).
    ``tracking`` is where the records go (``tracking/``): opened by ``train/loop.py``
    before the target loads; left out, ``run`` opens the configured sinks itself.
    """

    def __init__(self, cfg: JobConfig, target: Target | None = None, ranks: RankInfo | None = None, echo=print,
                 clock=time.monotonic, features=None, timings: Timings | None = None,
                 data_parallel: DataParallel | None = None, tracking: Tracking | None = None):
        self.cfg = cfg
        self.clock = clock
        self.ranks = ranks or RankInfo()
        self.echo = echo if self.ranks.is_main else (lambda *a, **k: None)
        self.device = resolve_device(cfg.train.device)
        self.dtype = target_dtype(cfg, self.device)
        self.run_dir = Path(cfg.train.run_dir)
        # target, drafter config, drafter and its wrapping, the step's spec: train/assembly.py, as the
        # benchmark and a disaggregated target rank build them
        # from a feature store (train.feature_store) only the target's embedding, final norm and lm_head load
        target = target or load_target(cfg.target, self.device, self.dtype, layers=cfg.train.loads_target_layers)
        parts = assemble(cfg, target, self.device, data_parallel, self.echo)
        self.target, self.drafter_cfg, self.drafter = parts.target, parts.drafter_cfg, parts.drafter
        self.model, self.compiled = parts.model, parts.compiled  # model: what a step calls (drafter or DDP)
        self._build_data()
        self.counters = Counters()
        budget = self.budget_seconds
        spent = (lambda: self.counters.train_seconds / budget) if budget > 0 else None  # the LR follows the clock
        self.step = parts.step(self.total_steps, self.ranks, spent)
        self.opts, self.optimizer, self.scheduler = self.step.opts, self.step.optimizer, self.step.scheduler
        self.graph_target_forward = replays_target_forward(cfg.train.cuda_graphs, cfg.train.fsdp_target, self.device)
        self.source = self._feature_source(features)
        self.timings = timings
        parts.graph_step(self.step, self.ranks, data_parallel, self.echo)
        self.stop_requested = False  # agreed by every rank after a step: the loop ends
        self._local_stop = False  # this rank's own request (a signal), agreed at the next step's end
        self.signalled = False  # SIGTERM/SIGINT (as opposed to the time budget) ended the run
        self.tracking = tracking
        self.checkpoints = CheckpointManager(
            self.run_dir, model=self.model, optimizer=self.optimizer, drafter=self.drafter,
            parts={"counters": self.counters, "data": self.batches, "scheduler": self.scheduler},
            config=cfg.to_dict(), drafter_config=self.drafter_cfg.to_dict(), step=lambda: self.counters.step,
            keep_last=cfg.train.keep_last, group=self.ranks.group, echo=self.echo)

    # -- set-up ----------------------------------------------------------------------------
    def _feature_source(self, features):
        """The local target (or the given source factory), behind the per-conversation feature
        cache when ``train.feature_cache`` is on; or the feature store of ``train.feature_store``, which
        ``train.feature_cache=disk`` writes in the first epoch (features/hybrid.py)."""
        if self.cfg.train.feature_cache == "disk":
            from dflash_train.features.hybrid import hybrid_source

            return hybrid_source(self, (features or LocalFeatures)(self))
        if self.cfg.train.feature_store:
            if features is not None:
                raise ValueError("train.feature_store replaces the target's forward; the disaggregated topology "
                                 "streams features from target ranks: use one or the other")
            from dflash_train.features.reader import store_source

            return store_source(self)
        source = (features or LocalFeatures)(self)
        where = self.cfg.train.feature_cache
        if where == "off":
            return source
        if features is not None:
            raise ValueError("train.feature_cache caches a local target's features (one process or colocated "
                             "ranks); the disaggregated topology streams them: set train.feature_cache=off")
        width = len(self.drafter_cfg.target_layer_ids) * self.target.facts.hidden_size
        cache = SampleFeatureCache(source, self.dataset["length"], width, self.dtype,
                                   self.device if where == "device" else "cpu", self.cfg.train.feature_cache_gib)
        self.echo(cache.describe())
        return cache

    def _build_data(self) -> None:
        cfg = self.cfg
        data = load_data(cfg, self.target.tokenizer, self.drafter_cfg.block_size)
        self.data = data  # the hybrid feature store completes the first epoch from it (features/hybrid.py)
        self.dataset, self.data_report, self.plan = data.dataset, data.report, data.plan
        if self.ranks.is_main:
            self.echo(self.data_report.format())
        self.batches = data.batches(self.ranks.rank, self.ranks.world, cfg.train.grad_accum)
        if cfg.data.prefetch_steps > 0:
            self.batches = PrefetchedBatches(self.batches, self._prepare_host, cfg.data.prefetch_steps,
                                             pin_memory=self.device.type == "cuda")
        per_step = cfg.train.grad_accum * self.ranks.world
        self.steps_per_epoch = data.steps_per_epoch(per_step)
        self.total_steps = data.total_steps(cfg, per_step)
        self.echo(f"data: {len(self.dataset)} sequences, {self.steps_per_epoch} steps/epoch, "
                  f"{self.total_steps} steps, padding waste {self.plan.padding_waste():.1%}")

    def _prepare_host(self, micro_batch: MicroBatch) -> None:
        """The host work of a micro-batch, done ahead by the prefetching thread: its anchors, the
        feature cache's indices, its conversation count (all kept in ``micro_batch.host``)."""
        self.step.anchors(micro_batch)
        if hasattr(self.source, "prefetch"):  # the feature cache's spilled rows, the feature store's rows
            self.source.prefetch(micro_batch)
        micro_batch.num_samples()

    # -- one step --------------------------------------------------------------------------
    def train_step(self, micro_batches: list[MicroBatch]) -> StepResult:
        """Forward + backward of every micro-batch of this rank, then one optimizer step."""
        if self.timings is None:
            return self.step(micro_batches, self.source.features, self.counters.step + 1)
        start = self.timings.mark()
        out = self.step(micro_batches, self.source.features, self.counters.step + 1)
        self.timings.span("step", start, self.timings.mark(), local=False)
        self.timings.steps += 1
        return out

    def check_bad_steps(self) -> None:
        """Read the device's non-finite-step counters (call only where the host syncs anyway:
        a log line, a save) and stop the run past ``train.max_bad_steps``."""
        count, first, loss, norm = self.step.bad.tolist()
        if count == 0:
            return
        self.step.bad.zero_()
        self.counters.bad_steps += int(count)
        allowed = self.cfg.train.max_bad_steps
        what = f"non-finite loss or gradient norm at step {int(first)} (loss {loss}, grad norm {norm})"
        if self.counters.bad_steps > allowed:
            raise NonFiniteError(
                f"{what}: {self.counters.bad_steps} bad step(s) in this run, train.max_bad_steps={allowed}; "
                f"stopped without saving a checkpoint (the newest saved one is untouched). Lower optim.lr, "
                f"check the data, or raise train.max_bad_steps to skip such steps")
        self.echo(f"skipped {int(count)} step(s) with no optimizer update: {what} "
                  f"({self.counters.bad_steps} of train.max_bad_steps={allowed} used)")

    # -- the clock (train.time_budget_minutes) -----------------------------------------------
    @property
    def budget_seconds(self) -> float:
        """``train.time_budget_minutes`` in seconds (0: no budget)."""
        return self.cfg.train.time_budget_minutes * 60

    def budget_spent(self) -> bool:
        return self.budget_seconds > 0 and self.counters.train_seconds >= self.budget_seconds

    def advance_clock(self, seconds: float) -> None:
        """Charge one step's wall time to the budget and agree with the other ranks on the clock
        (their max) and on stopping: DDP and checkpoints are collective, so every rank must end
        after the same step and use the same LR (which follows the time budget)."""
        stop, self.signalled, self.counters.train_seconds = self.ranks.agree(
            self.counters.step, self._local_stop, self.signalled, self.counters.train_seconds + seconds)
        if (stop or self.budget_spent()) and not self.stop_requested:
            self.stop_requested = True
            reason = (f"time budget of {self.cfg.train.time_budget_minutes:g} min spent" if self.budget_spent()
                      else "stop requested")
            every = "; every rank stops here" if self.ranks.world > 1 else ""
            self.echo(f"{reason} at step {self.counters.step}{every}")

    def _on_signal(self, name: str) -> None:
        self._local_stop = self.signalled = True
        self.echo(f"signal {name}: finishing this step, then saving and exiting")

    # -- the loop --------------------------------------------------------------------------
    def run(self, on_step_end=None) -> dict:
        """Train to ``total_steps``. ``on_step_end(trainer)`` runs after every step
        (checkpointing, evaluation); SIGTERM/SIGINT finish the step and stop."""
        self._make_run_dir()
        self.open_tracking()
        window = MetricWindow()
        bar = self._progress_bar()
        history = []
        first_step = True  # compilation / warm-up: not charged to the time budget
        try:  # the prefetching thread stops however the loop ends (a non-finite loss, a signal)
            with StopOnSignals(self._on_signal):
                while self.counters.step < self.total_steps and not self.stop_requested and not self.budget_spent():
                    started = self.clock()
                    micro_batches = self.source.next_step()
                    result = self.train_step(micro_batches)
                    loss, stats, grad_norm = result.loss, result.stats, result.grad_norm
                    tokens = self._count(micro_batches)
                    self.advance_clock(0.0 if first_step else self.clock() - started)
                    first_step = False
                    window.add_step(loss, stats, tokens, good=self.step.last_ok)
                    if bar is not None:
                        bar.update(1)
                    if self.counters.step % self.cfg.train.log_every == 0 or self._last_step():
                        history.append(self._log_window(window, bar, grad_norm, micro_batches[0].epoch))
                    if on_step_end is not None:
                        on_step_end(self)
        finally:
            if isinstance(self.batches, PrefetchedBatches):
                self.batches.close()
        self.source.finish()
        if bar is not None:
            bar.close()
        out = {"history": history, "steps": self.counters.step, "stopped_early": self.signalled}
        if hasattr(self.source, "report"):  # the feature cache's or the feature store's (summary.json)
            out["sources"] = {self.source.summary_key: self.source.report()}
            self.echo(self.source.report_line(out["sources"][self.source.summary_key]))
        return out

    def _last_step(self) -> bool:
        return self.counters.step == self.total_steps or self.stop_requested

    def _log_window(self, window: MetricWindow, bar, grad_norm, epoch: int) -> dict:
        """Close the logging window: one host sync, the record (with the per-role seconds of
        ``timings``) logged and echoed, the window reset."""
        record = {**window.summary(), "lr": self.scheduler.get_last_lr()[0], "grad_norm": float(grad_norm),
                  "epoch": epoch}
        record["tokens_per_s"] *= self.ranks.world
        self.check_bad_steps()  # the host has just synced for the record
        if self.counters.bad_steps:
            record["bad_steps"] = self.counters.bad_steps
        echo = bar.write if bar is not None else self.echo
        if self.timings is not None:
            spent = self.timings.summary()  # every rank: it resolves and resets the window's spans
            record.update(spent)
            if spent:
                echo(format_timings(spent))
        self.tracking.log(self.counters.step, record)
        echo(format_record({"step": self.counters.step, **record}))
        window.reset()
        return {"step": self.counters.step, **record}

    def _make_run_dir(self) -> None:
        """The run folder, or one line naming it (no space, read-only, a file or dangling link there)."""
        with explained("cannot create the run folder", self.run_dir, WRITE_TODO):
            self.run_dir.mkdir(parents=True, exist_ok=True)

    def open_tracking(self) -> Tracking:
        """The sinks the records go to: those passed in, else the configured ones, opened here
        for a fresh run (the main rank; the others log nowhere)."""
        if self.tracking is None:
            self._make_run_dir()
            self.tracking = (open_tracking(SinkSettings.of_job(self.cfg, resuming=False), warn=self.echo)
                             if self.ranks.is_main else Tracking())
        return self.tracking

    def _count(self, micro_batches: list[MicroBatch]) -> int:
        """Advance the step and the consumed-data counters; this rank's real (unpadded) tokens."""
        self.counters.step += 1
        samples = sum(mb.num_samples() for mb in micro_batches)
        tokens = sum(int(mb.attention_mask.sum()) for mb in micro_batches)
        self.counters.samples += samples * self.ranks.world
        self.counters.tokens += tokens * self.ranks.world
        return tokens

    def _progress_bar(self):
        if not (self.cfg.train.progress and self.ranks.is_main):
            return None
        from tqdm import tqdm

        return tqdm(total=self.total_steps, initial=self.counters.step, desc="train", unit="step", dynamic_ncols=True)

    # -- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Save a checkpoint (every rank calls this; ``checkpoints``, the run's
        ``CheckpointManager``, says what it holds). A run whose skipped non-finite steps exceed
        ``train.max_bad_steps`` raises here instead of saving."""
        self.check_bad_steps()
        return self.checkpoints.save()
