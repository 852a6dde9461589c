"""Pieces shared by the colocated and disaggregated set-ups: DDP/FSDP2 wrapping of the
drafter, a stop flag agreed by all drafter ranks, and busy/wait timing in the metrics."""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dflash_train.distributed import watchdog
from dflash_train.train.metrics import MetricLogger
from dflash_train.train.optim import build_optimizer


class DDP(DistributedDataParallel):
    """DDP that forwards attribute reads (``layer_types``, ``sliding_window``...) to the drafter.

    Dynamo's DDP optimizer is turned off: it splits every compiled graph run under DDP at
    gradient-bucket boundaries, so the drafter layer compiled into different graphs on N GPUs
    than on one (a warm one-GPU cache was missed: the first 2-GPU step compiled for 20 s) and
    into several pieces per layer. Each drafter layer is its own compiled graph already, so
    gradients still reach DDP's buckets layer by layer, overlapping the backward.
    """

    def __init__(self, *args, **kwargs):
        torch._dynamo.config.optimize_ddp = False
        super().__init__(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def wrap_drafter(trainer, group, device: torch.device) -> None:
    """``trainer.model`` becomes DDP (default) or the drafter sharded with FSDP2 (``train.fsdp_drafter``)."""
    if trainer.cfg.train.fsdp_drafter:
        _fully_shard_drafter(trainer, group, device)
        return
    ids = [device.index] if device.type == "cuda" else None
    trainer.model = DDP(trainer.drafter, device_ids=ids, process_group=group)


def _mesh(group, device: torch.device):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, device.type)


def _fully_shard_drafter(trainer, group, device: torch.device) -> None:
    """FSDP2: one unit per drafter layer plus the root; the optimizer is rebuilt on the sharded params.

    FSDP2 reduce-scatters the MEAN gradient, like DDP, so the trainer's ``* world`` holds.
    ``no_sync`` is provided (gradient sync only on the last micro-batch of a step).
    """
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh(group, device)
    drafter = trainer.drafter
    for layer in drafter.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(drafter, mesh=mesh)

    @contextlib.contextmanager
    def no_sync():
        drafter.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            drafter.set_requires_gradient_sync(True)

    drafter.no_sync = no_sync
    trainer.model = drafter
    cfg = trainer.cfg
    trainer.optimizer = build_optimizer(drafter.parameters(), cfg.optim, fused=device.type == "cuda")
    trainer.scheduler = trainer.build_scheduler()


def fully_shard_target(target, group, device: torch.device) -> None:
    """FSDP2 over the target's decoder layers only (forward only, resharded after each layer's forward).

    The embedding, final norm and lm_head stay whole on every rank: the drafter reads them
    directly. Every rank must run the same number of target forwards (true when colocated).
    """
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh(group, device)
    for layer in target.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)


class Timings:
    """Seconds spent per phase since the last log line, reported as per-step means.

    No host synchronization in the step: on CUDA a phase is timed with a pair of CUDA events
    recorded on the current stream (GPU time of the work between them), and the events are
    resolved once per log line (``summary``), where the logger synchronizes anyway to read
    the loss. On the CPU the host clock is exact (the work is synchronous). ``add`` takes
    host-measured seconds (the disaggregated receive wait, remote ranks' own timings).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.events = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.steps = 0
        self.local = 0.0  # host-measured seconds added with local=True (see add)
        self.pending: list[tuple[str, object, object, bool]] = []  # (name, start, end, local)

    def add(self, name: str, seconds: float, local: bool = True) -> None:
        """``local``: time this process spent inside a step (subtracted from drafter compute);
        remote values (the target ranks' own timings, received in the headers) are not."""
        self.sums[name] = self.sums.get(name, 0.0) + seconds
        if local:
            self.local += seconds

    def mark(self):
        """A point in time: a recorded CUDA event, or the host clock."""
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def span(self, name: str, start, end, local: bool = True) -> None:
        """Account ``start`` -> ``end`` (two marks) to ``name``, resolved in ``summary``."""
        self.pending.append((name, start, end, local))

    def _seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.events else end - start

    @contextlib.contextmanager
    def measure(self, name: str):
        start = self.mark()
        try:
            yield
        finally:
            self.span(name, start, self.mark())

    def summary(self) -> dict[str, float]:
        """Per-step means since the last call; ``drafter_compute`` = step - local phases."""
        if self.events and self.pending:
            torch.cuda.synchronize(self.device)  # once per log line: the events are done
        step_total, local = 0.0, self.local
        for name, start, end, is_local in self.pending:
            seconds = self._seconds(start, end)
            if name == "step":
                step_total += seconds
                continue
            self.sums[name] = self.sums.get(name, 0.0) + seconds
            local += seconds if is_local else 0.0
        steps = max(self.steps, 1)
        out = {f"{k}_s": v / steps for k, v in self.sums.items()}
        if self.steps:
            out["drafter_compute_s"] = max(0.0, step_total - local) / steps
        self.reset()
        return out


class TimedLogger(MetricLogger):
    """The trainer's logger plus the busy/wait seconds per step of each role."""

    def __init__(self, run_dir, tensorboard: bool, enabled: bool, timings: Timings):
        run_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(run_dir, tensorboard, enabled)
        self.timings = timings

    def log(self, step: int, record: dict, echo=print) -> None:
        if "loss" in record:  # a training record (not a held-out tau line)
            extra = self.timings.summary()
            record = {**record, **extra}
            if self.enabled and extra:
                echo("  time/step: " + ", ".join(f"{k[:-2]} {v * 1000:.1f} ms" for k, v in sorted(extra.items())))
        super().log(step, record, echo)


def install_step_hooks(trainer, control, timings: Timings, on_last_step=None) -> None:
    """Per step: time it (drafter compute = step time - target forward) and agree on the clock.

    Ranks must make the same decisions after every step: stop or go on (DDP and checkpoints
    are collective), evaluate or not, and the LR (which follows the time budget). So after each
    step one small all-reduce (MAX) over ``control``, a CPU (gloo) group of the drafter ranks,
    agrees on [stop requested, signalled, training seconds]: a host round-trip, never a GPU
    synchronization. ``on_last_step`` runs on the step after which the ranks stop.
    """
    _agree_on_stop(trainer, control, on_last_step)
    inner = trainer.train_step

    def train_step(micro_batches):
        start = timings.mark()
        out = inner(micro_batches)
        timings.span("step", start, timings.mark(), local=False)
        timings.steps += 1
        watchdog.beat(f"after step {trainer.counters.step + 1}", steady=True)
        return out

    trainer.train_step = train_step
    trainer.logger = TimedLogger(trainer.run_dir, trainer.cfg.train.tensorboard, trainer.ranks.is_main, timings)


def _agree_on_stop(trainer, control, on_last_step) -> None:
    """``trainer.stop_requested`` reads the AGREED flag (set by the per-step all-reduce in
    ``advance_clock``); writes (the signal handler, a spent budget) only raise this rank's
    local request. A signal arriving between the all-reduce and the loop's check can then
    never make one rank stop alone. ``counters.train_seconds`` becomes the max over ranks."""

    def get(self):
        return self._agreed_stop

    def set_(self, value):
        if value:
            self._local_stop = True

    def advance_clock(self, seconds: float) -> None:
        local_seconds = self.counters.train_seconds + seconds
        message = torch.tensor([float(self._local_stop), float(self.signalled), local_seconds], dtype=torch.float64)
        dist.all_reduce(message, op=dist.ReduceOp.MAX, group=control)
        self.counters.train_seconds = float(message[2])
        self.signalled = self.signalled or bool(message[1] > 0)
        if (message[0] > 0 or self.budget_spent()) and not self._agreed_stop:
            self._agreed_stop = True
            reason = "time budget spent" if self.budget_spent() else "stop requested"
            self.echo(f"{reason}: every rank stops after step {self.counters.step}")
        if on_last_step is not None and (self._agreed_stop or self.counters.step >= self.total_steps):
            on_last_step()

    base = type(trainer)
    trainer.__class__ = type(f"Distributed{base.__name__}", (base,),
                             {"stop_requested": property(get, set_), "advance_clock": advance_clock})
    trainer._local_stop = bool(trainer.__dict__.pop("stop_requested", False))
    trainer._agreed_stop = False
