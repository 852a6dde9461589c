"""The single-process training loop (the distributed layer wraps the same pieces).

One optimizer step = ``grad_accum`` micro-batches on this rank (and the matching
micro-batches on the other ranks). The loss of the step is
``sum(w * CE) / sum(w)`` over ALL its micro-batches on ALL ranks: the weight total
is known before any backward (labels and weights come from the anchors, drawn on
the CPU), so splitting a step across micro-batches or ranks does not change the
gradient, only the float summation order.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from dflash_train.config import JobConfig
from dflash_train.data import BatchIterator, MicroBatch, batch_plan, load_tokenized
from dflash_train.models.config import resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.models.target import Target, choose_mask_token_id
from dflash_train.objective.blocks import default_gamma, sample_batch_anchors, uniform_anchors
from dflash_train.objective.loss import acceptance_stats
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks
from dflash_train.train.metrics import MetricLogger, MetricWindow
from dflash_train.train.optim import build_optimizer, build_scheduler
from dflash_train.train.parallelize import parallelize_drafter


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name}: CUDA is not available here (torch {torch.__version__}); "
                         f"use train.device=cpu or auto")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


@dataclass
class Counters:
    """Progress that a checkpoint must restore (plain ints)."""

    step: int = 0  # optimizer steps done
    samples: int = 0  # sequences consumed (all ranks)
    tokens: int = 0  # context tokens consumed (all ranks)
    train_seconds: float = 0.0  # wall time inside training steps (for train.time_budget_minutes)
    bad_steps: int = 0  # steps skipped for a non-finite loss or gradient norm (train.max_bad_steps)


@dataclass
class RankInfo:
    rank: int = 0
    world: int = 1
    group: object = None  # process group of the drafter data-parallel ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class NonFiniteError(ValueError):
    """More non-finite steps than ``train.max_bad_steps``: the run stops, unsaved."""


class Trainer:
    """Builds target, drafter, data, optimizer from a ``JobConfig`` and trains.

    ``clock`` (seconds, monotonic) times the steps charged to ``train.time_budget_minutes``;
    tests pass a fake one so time-dependent behaviour does not depend on the machine's speed.
    """

    def __init__(self, cfg: JobConfig, target: Target | None = None, ranks: RankInfo | None = None, echo=print,
                 clock=time.monotonic):
        self.cfg = cfg
        self.clock = clock
        self.ranks = ranks or RankInfo()
        self.echo = echo if self.ranks.is_main else (lambda *a, **k: None)
        self.device = resolve_device(cfg.train.device)
        self.dtype = resolve_dtype(cfg.target.dtype, self.device)
        self.run_dir = Path(cfg.train.run_dir)
        self.target = target or Target.load(cfg.target.path, self.dtype, self.device, cfg.target.gguf_file)
        self.drafter_cfg = self._resolve_drafter()
        torch.manual_seed(cfg.train.seed)
        self.drafter = DFlashDrafter(self.drafter_cfg).to(self.device)
        if cfg.train.init_from:
            self._warm_start(cfg.train.init_from)
        self.opts = self._objective_options()
        self.compiled = cfg.train.compile and self.device.type == "cuda"
        parallelize_drafter(self.drafter, cfg.train.activation_checkpointing, compile=self.compiled)
        self._build_data()
        # Fused AdamW (CUDA and CPU) can skip a step on the device (``found_inf``): see _optimizer_step.
        self.optimizer = build_optimizer(self.drafter.parameters(), cfg.optim,
                                         fused=self.device.type in ("cuda", "cpu"))
        self._bad = torch.zeros(4, device=self.device)  # non-finite steps: count, first step, its loss, norm
        self.counters = Counters()
        self.scheduler = self.build_scheduler()
        self.stop_requested = False
        self.signalled = False  # SIGTERM/SIGINT (as opposed to the time budget) ended the run
        self.logger: MetricLogger | None = None
        self.model = self.drafter  # what forward calls: wrapped by DDP / compile in the parallel layer
        # Where context features come from: the local target (colocated) by default; the
        # disaggregated layer swaps in a receiver fed by target ranks.
        self.feature_source = self.local_features

    # -- set-up ----------------------------------------------------------------------------
    def build_scheduler(self):
        """The LR schedule over ``total_steps`` (and the time budget, when one is set)."""
        budget = self.budget_seconds
        spent = (lambda: self.counters.train_seconds / budget) if budget > 0 else None
        return build_scheduler(self.optimizer, self.cfg.optim, self.total_steps, spent)

    def _resolve_drafter(self):
        facts = self.target.facts
        mask_id, reason = None, "given in the config"
        if self.cfg.drafter.mask_token_id is None:
            mask_id, reason = choose_mask_token_id(self.target.tokenizer, facts.vocab_size)
        resolved = resolve_drafter_config(self.cfg.drafter, facts, mask_id)
        self.target.validate_layer_ids(resolved.target_layer_ids)
        self.echo(f"drafter: {resolved.num_hidden_layers} layers, block {resolved.block_size}, target layers "
                  f"{resolved.target_layer_ids}, mask token {resolved.mask_token_id} ({reason})")
        return resolved

    def _warm_start(self, folder: str) -> None:
        from dflash_train.export.serving import load_drafter_folder

        loaded, _ = load_drafter_folder(folder, self.target)
        self.drafter.load_state_dict(loaded.state_dict())
        self.echo(f"warm start from {folder}")

    def _objective_options(self) -> ObjectiveOptions:
        t = self.cfg.train
        attention = t.attention
        if attention == "auto":
            attention = "flex" if self.device.type == "cuda" else "sdpa"
        block = self.drafter_cfg.block_size
        return ObjectiveOptions(
            block_size=block,
            mask_token_id=self.drafter_cfg.mask_token_id,
            gamma=t.gamma or default_gamma(block),
            attention=attention,
            loss_chunk_size=t.loss_chunk_size,
        )

    def _build_data(self) -> None:
        cfg, tokenizer = self.cfg, self.target.tokenizer
        self.dataset, self.data_report = load_tokenized(cfg.data, tokenizer, self.drafter_cfg.block_size)
        if self.ranks.is_main:
            self.echo(self.data_report.format())
        self.plan = batch_plan(self.dataset["length"], cfg.data, cfg.train.seed)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.batches = BatchIterator(
            self.dataset, self.plan, pad_id=pad_id, rank=self.ranks.rank, world_size=self.ranks.world,
            micro_batches_per_step=cfg.train.grad_accum,
        )
        per_step = cfg.train.grad_accum * self.ranks.world
        self.steps_per_epoch = max(1, len(self.plan.epoch_micro_batches(0)) // per_step)
        self.total_steps = cfg.train.max_steps or max(1, math.ceil(cfg.train.epochs * self.steps_per_epoch))
        self.echo(f"data: {len(self.dataset)} sequences, {self.steps_per_epoch} steps/epoch, "
                  f"{self.total_steps} steps, padding waste {self.plan.padding_waste():.1%}")

    # -- one step --------------------------------------------------------------------------
    def anchors_for(self, mb: MicroBatch):
        t = self.cfg.train
        if t.anchors == "uniform":
            return uniform_anchors(mb.loss_mask, t.num_anchors, self.opts.block_size, mb.doc_ids)
        return sample_batch_anchors(mb.loss_mask, mb.sample_ids, t.num_anchors, t.seed, mb.epoch, mb.doc_ids)

    def prepare(self, mb: MicroBatch):
        """CPU anchors -> device blocks for one micro-batch."""
        anchors, keep = self.anchors_for(mb)
        to = {"device": self.device, "non_blocking": True}
        input_ids, loss_mask = mb.input_ids.to(**to), mb.loss_mask.to(**to)
        doc_ids = None if mb.doc_ids is None else mb.doc_ids.to(**to)
        blocks = make_blocks(input_ids, loss_mask, anchors.to(**to), keep.to(**to), self.opts, doc_ids)
        return input_ids, mb.attention_mask.to(**to), blocks

    def local_features(self, micro_batch: MicroBatch, input_ids, attention_mask) -> torch.Tensor:
        doc_ids = None if micro_batch.doc_ids is None else micro_batch.doc_ids.to(input_ids.device)
        return self.target.features(input_ids, attention_mask, self.drafter_cfg.target_layer_ids, doc_ids)

    def global_weight(self, prepared) -> torch.Tensor:
        total = sum(blocks.weights.sum() for _, _, blocks in prepared)
        if self.ranks.world > 1:
            dist.all_reduce(total, group=self.ranks.group)
        return total.clamp(min=1e-6)

    def train_step(self, micro_batches: list[MicroBatch]):
        """Forward + backward of every micro-batch of this rank, then one optimizer step."""
        prepared = [self.prepare(mb) for mb in micro_batches]
        total_weight = self.global_weight(prepared)
        autocast = torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)
        step_loss = torch.zeros((), device=self.device)
        stats = []
        for index, (input_ids, attention_mask, blocks) in enumerate(prepared):
            features = self.feature_source(micro_batches[index], input_ids, attention_mask)
            with autocast, self._no_sync(index < len(prepared) - 1):
                out = drafter_loss(self.model, self.target.embed_tokens, self.target.lm_head_weight, features,
                                   blocks, self.opts)
                loss = out.weighted_ce / total_weight
                (loss * self.ranks.world).backward()  # DDP averages over ranks; we want the global sum
            step_loss += loss.detach()
            stats.append(acceptance_stats(out.correct, out.valid, blocks.keep))
        if self.ranks.world > 1:
            dist.all_reduce(step_loss, group=self.ranks.group)
        grad_norm = self._optimizer_step(step_loss)
        return step_loss, stats, grad_norm

    def _no_sync(self, skip: bool):
        if skip and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _optimizer_step(self, step_loss: torch.Tensor) -> torch.Tensor:
        """Clip, then step, unless the loss or the gradient norm is not finite.

        Deciding that on the host would cost a device synchronization every step (the
        trainer has none: the loop syncs only at log lines). So the decision stays on the
        device: the clip already reduces every gradient to one norm; ``ok`` is two more
        scalar ops on it and the (already reduced, identical on every rank) loss. The fused
        AdamW kernel takes it as ``found_inf`` (the mechanism AMP's GradScaler uses): a bad
        step leaves weights, moments and the step count untouched. The host reads the
        counters in ``_bad`` at the next log line or save (``check_bad_steps``), where it
        synchronizes anyway. The LR schedule advances on a skipped step (its data is consumed).
        Without a fused optimizer (a device other than CUDA/CPU) the host decides, at the
        price of a sync.
        """
        clip = self.cfg.optim.grad_clip
        params = self.drafter.parameters()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor; the whole norm (a device collective)
            grad_norm = grad_norm.full_tensor()
        ok = torch.isfinite(step_loss) & torch.isfinite(grad_norm)
        self.last_step_ok = ok
        bad = ~ok
        first = bad & (self._bad[0] == 0)
        step = self._bad.new_full((), float(self.counters.step + 1))  # a fill kernel: no host-to-device copy
        values = torch.stack([self._bad[0] + bad, step, step_loss.float(), grad_norm.float()])
        self._bad = torch.where(torch.stack([bad, first, first, first]), values, self._bad)
        if self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf = bad.float()
            self.optimizer.step()
        elif bool(ok):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def check_bad_steps(self) -> None:
        """Read the device's non-finite-step counters (call only where the host syncs anyway:
        a log line, a save) and stop the run past ``train.max_bad_steps``."""
        count, first, loss, norm = self._bad.tolist()
        if count == 0:
            return
        self._bad.zero_()
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
        """Charge one step's wall time to the budget; ask to stop once it is spent. (The
        distributed layer overrides this to agree on the clock and on stopping.)"""
        self.counters.train_seconds += seconds
        if self.budget_spent() and not self.stop_requested:
            self.echo(f"time budget of {self.cfg.train.time_budget_minutes:g} min spent at step {self.counters.step}")
            self.stop_requested = True

    # -- the loop --------------------------------------------------------------------------
    def run(self, on_step_end=None) -> dict:
        """Train to ``total_steps``. ``on_step_end(trainer)`` runs after every step
        (checkpointing, evaluation); SIGTERM/SIGINT finish the step and stop."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        logger = self.open_logger()
        window = MetricWindow()
        bar = self._progress_bar()
        history = []
        first_step = True  # compilation / warm-up: not charged to the time budget
        with _stop_on_signals(self):
            while self.counters.step < self.total_steps and not self.stop_requested and not self.budget_spent():
                started = self.clock()
                micro_batches = self.batches.next_step()
                loss, stats, grad_norm = self.train_step(micro_batches)
                tokens = self._count(micro_batches)
                self.advance_clock(0.0 if first_step else self.clock() - started)
                first_step = False
                window.add_step(loss, stats, tokens, good=getattr(self, "last_step_ok", None))
                if bar is not None:
                    bar.update(1)
                last = self.counters.step == self.total_steps or self.stop_requested
                if self.counters.step % self.cfg.train.log_every == 0 or last:
                    record = {**window.summary(), "lr": self.scheduler.get_last_lr()[0],
                              "grad_norm": float(grad_norm), "epoch": micro_batches[0].epoch}
                    record["tokens_per_s"] *= self.ranks.world
                    self.check_bad_steps()  # the host has just synced for the record
                    if self.counters.bad_steps:
                        record["bad_steps"] = self.counters.bad_steps
                    history.append({"step": self.counters.step, **record})
                    logger.log(self.counters.step, record, echo=bar.write if bar is not None else self.echo)
                    window.reset()
                if on_step_end is not None:
                    on_step_end(self)
        if bar is not None:
            bar.close()
        return {"history": history, "steps": self.counters.step, "stopped_early": self.signalled}

    def open_logger(self) -> MetricLogger:
        if self.logger is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.logger = MetricLogger(self.run_dir, self.cfg.train.tensorboard, enabled=self.ranks.is_main)
        return self.logger

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

    # -- state for checkpoints -------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "counters": vars(self.counters).copy(),
            "data": self.batches.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.counters = Counters(**state["counters"])
        self.batches.load_state_dict(state["data"])
        self.scheduler.load_state_dict(state["scheduler"])


class _stop_on_signals:
    """SIGTERM/SIGINT set ``trainer.stop_requested``: the step in flight finishes,
    then the loop ends and the caller saves a checkpoint. A second signal aborts."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.previous = {}
        self.first_signal = 0.0

    def _handler(self, signum, frame):
        # A Ctrl-C under torchrun reaches a worker twice (from the terminal and forwarded by
        # torchrun) within milliseconds: count that as one signal.
        if self.trainer.stop_requested and time.monotonic() - self.first_signal > 2.0:
            raise KeyboardInterrupt
        if self.trainer.stop_requested:
            return
        self.first_signal = time.monotonic()
        self.trainer.signalled = True
        self.trainer.stop_requested = True
        self.trainer.echo(f"signal {signal.Signals(signum).name}: finishing this step, then saving and exiting")

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers
                self.previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False
