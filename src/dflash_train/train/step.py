"""One optimizer step of the drafter: the code the trainer runs and the benchmark times.

One step = this rank's micro-batches (``grad_accum``), and the matching micro-batches on the
other drafter ranks. The loss of the step is ``sum(w * loss) / N`` over ALL its
micro-batches on ALL ranks, N the weighting's normalizer (the decay weights' sum, or D-PACE's label
count): known before any backward (labels and weights come from the anchors, drawn on the CPU), so
splitting a step across micro-batches or ranks does not change the gradient, only the float
summation order.

``mark(phase)`` (default: nothing) is called as each phase ends (``prepare``,
``target_forward``, ``drafter_forward``, ``backward``, ``optimizer``); the benchmark's
profiled pass synchronizes there. The trainer passes none: the step has no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dflash_train.config import OptimConfig, TrainConfig
from dflash_train.data.batching import MicroBatch
from dflash_train.devices import to_device_async
from dflash_train.objective.blocks import sample_batch_anchors, uniform_anchors
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.objective.loss import acceptance_stats
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks
from dflash_train.train.cuda_graphs import GraphedStep
from dflash_train.train.optim import build_optimizer, build_scheduler, clip_gradients, skips_on_device
from dflash_train.train.parallelize import no_sync, step_begin


def _no_mark(_phase: str) -> None:
    pass


@dataclass
class Anchors:
    """How a micro-batch's anchors are drawn: ``random`` (fresh per sample and epoch, the
    paper's) or ``uniform`` (fixed blocks, the ablation)."""

    mode: str
    num_anchors: int
    seed: int
    block_size: int

    def __call__(self, mb: MicroBatch):
        """``(anchors, keep)``; drawn once per micro-batch (a prefetching iterator draws them ahead,
        into ``mb.host``)."""
        if "anchors" not in mb.host:
            mb.host["anchors"] = self.draw(mb)
        return mb.host["anchors"]

    def draw(self, mb: MicroBatch):
        if self.mode == "uniform":
            return uniform_anchors(mb.loss_mask, self.num_anchors, self.block_size, mb.doc_ids)
        return sample_batch_anchors(mb.loss_mask, mb.sample_ids, self.num_anchors, self.seed, mb.epoch, mb.doc_ids)


@dataclass
class StepSpec:
    """What a training step is made of besides its modules: the objective, the anchors, the
    compile mode. The run's assembly (``train/assembly.step_spec``) takes it from the job config
    (``from_job``) for the trainer and the benchmark alike; ``build_train_step`` turns it into the
    step both run."""

    block_size: int
    mask_token_id: int
    num_anchors: int
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    seed: int = 0
    anchors: str = "random"  # random (the paper's) or uniform (fixed blocks)
    attention: str = "auto"  # auto: flex on CUDA, sdpa elsewhere
    compiled: bool = False  # the drafter layers and the loss chunks through torch.compile
    compile_mode: str = "default"  # the layers' inductor mode (reduce-overhead: a graph generation per step)

    @classmethod
    def from_job(cls, objective: ObjectiveConfig, train: TrainConfig, block_size: int, mask_token_id: int,
                 compiled: bool) -> StepSpec:
        return cls(block_size, mask_token_id, train.num_anchors, objective, train.seed, train.anchors,
                   train.attention, compiled, train.compile_mode)

    def options(self, device: torch.device) -> ObjectiveOptions:
        attention = self.attention
        if attention == "auto":
            attention = "flex" if device.type == "cuda" else "sdpa"
        return ObjectiveOptions(self.block_size, self.mask_token_id, self.objective, attention, self.compiled)


def build_train_step(spec: StepSpec, model, drafter, target, optim: OptimConfig, total_steps: int,
                     device: torch.device, dtype: torch.dtype, ranks, time_fraction=None) -> TrainStep:
    """The step the trainer runs and the benchmark times, with its optimizer over ``drafter``'s
    parameters (fused on CUDA and CPU: it can then skip a non-finite step on the device, see
    ``TrainStep._update``) and its LR schedule over ``total_steps`` (``time_fraction``: see
    ``optim.build_scheduler``). ``model``: what a step calls (the drafter or its DDP/FSDP wrapper)."""
    optimizer = build_optimizer(drafter, optim, fused=device.type in ("cuda", "cpu"))
    scheduler = build_scheduler(optimizer, optim, total_steps, time_fraction)
    anchors = Anchors(spec.anchors, spec.num_anchors, spec.seed, spec.block_size)
    begin = step_begin(spec.compile_mode if spec.compiled else "default")
    return TrainStep(model, drafter, target, optimizer, scheduler, spec.options(device), anchors, optim.grad_clip,
                     device, dtype, ranks, begin)


@dataclass
class StepResult:
    loss: torch.Tensor  # the step's global loss (device scalar)
    stats: list  # per micro-batch acceptance statistics (device tensors)
    grad_norm: torch.Tensor
    kept_blocks: int  # valid blocks on this rank (counted on the CPU)


@dataclass
class DeviceBatch:
    """One micro-batch's tensors on the device (``doc_ids``: packed rows, else None) and its kept
    block count (counted on the host)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    anchors: torch.Tensor
    keep: torch.Tensor
    doc_ids: torch.Tensor | None
    kept: int

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """What the drafter's step reads (a CUDA graph's static inputs), as ``TrainStep.blocks`` takes them."""
        return tuple(t for t in (self.input_ids, self.loss_mask, self.anchors, self.keep, self.doc_ids)
                     if t is not None)


class TrainStep:
    """``graph`` (``train/cuda_graphs.GraphedStep``, or None): replays a one-micro-batch, one-rank
    step as one CUDA graph; ``begin`` (or None): called first in every step (a new CUDA-graph
    generation under ``train.compile_mode=reduce-overhead``)."""

    def __init__(self, model, drafter, target, optimizer, scheduler, opts: ObjectiveOptions, anchors: Anchors,
                 grad_clip: float, device: torch.device, dtype: torch.dtype, ranks, begin=None):
        self.model, self.drafter, self.target = model, drafter, target
        self.optimizer, self.scheduler = optimizer, scheduler
        self.opts, self.anchors, self.grad_clip = opts, anchors, grad_clip
        self.device, self.dtype, self.ranks = device, dtype, ranks
        self.begin = begin
        self.graph = None  # set by ``use_graph``
        self.bad = torch.zeros(4, device=device)  # non-finite steps: count, first step, its loss, norm
        self.last_ok: torch.Tensor | None = None

    def use_graph(self, graph) -> None:
        """Replay one-micro-batch steps through ``graph`` (a ``GraphedStep`` over ``graph_body``)."""
        self.graph = graph

    def graph_whole_step(self, capture=None) -> None:
        """Replay each one-micro-batch step as one CUDA graph after two eager steps (``capture``:
        a stand-in for the CUDA capture, CPU tests; ``train/cuda_graphs.GraphedStep``)."""
        self.use_graph(GraphedStep(self.graph_body, self.optimizer, capture=capture))

    def to_device(self, mb: MicroBatch) -> DeviceBatch:
        """CPU anchors and tokens -> device tensors for one micro-batch."""
        anchors, keep = self.anchors(mb)
        ids, attention, loss_mask, anchors_on, keep_on = (to_device_async(t, self.device) for t in (
            mb.input_ids, mb.attention_mask, mb.loss_mask, anchors, keep))
        doc_ids = None if mb.doc_ids is None else to_device_async(mb.doc_ids, self.device)
        return DeviceBatch(ids, attention, loss_mask, anchors_on, keep_on, doc_ids, int(keep.sum()))

    def blocks(self, tensors: tuple[torch.Tensor, ...]):
        """The micro-batch's blocks from ``DeviceBatch.tensors()`` (ids, loss mask, anchors, keep[, doc ids])."""
        input_ids, loss_mask, anchors, keep, *doc_ids = tensors
        return make_blocks(input_ids, loss_mask, anchors, keep, self.opts, doc_ids[0] if doc_ids else None)

    def global_weight(self, blocks) -> torch.Tensor:
        """The step's divisor over all its micro-batches and ranks, known before any forward: the
        decay weights' sum, or the label count under D-PACE (``objective/weighting.py``)."""
        total = sum(self.opts.normalizer(b) for b in blocks)
        if self.ranks.world > 1:
            dist.all_reduce(total, group=self.ranks.group)
        return total.clamp(min=1e-6)

    def __call__(self, micro_batches: list[MicroBatch], features, step_number: int, mark=_no_mark) -> StepResult:
        """Forward + backward of every micro-batch, then one optimizer step. ``features(mb,
        input_ids, attention_mask)`` gives a micro-batch's target features (and, with a kl/tv target,
        the target's final hidden states: a pair)."""
        if self.begin is not None:
            self.begin()
        batches = [self.to_device(mb) for mb in micro_batches]
        if self.graph is not None and len(batches) == 1:
            return self._graphed(micro_batches[0], batches[0], features, step_number)
        blocks = [self.blocks(b.tensors()) for b in batches]
        total_weight = self.global_weight(blocks)
        mark("prepare")
        step_loss = torch.zeros((), device=self.device)
        stats = []
        for index, (batch, block) in enumerate(zip(batches, blocks)):
            context = features(micro_batches[index], batch.input_ids, batch.attention_mask)
            mark("target_forward")
            loss, stat = self._forward_backward(block, context, total_weight, index < len(batches) - 1, mark)
            mark("backward")
            step_loss += loss
            stats.append(stat)
        if self.ranks.world > 1:
            dist.all_reduce(step_loss, group=self.ranks.group)
        grad_norm = self._update(step_loss, self.bad.new_full((), float(step_number)))
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        mark("optimizer")
        return StepResult(step_loss, stats, grad_norm, sum(b.kept for b in batches))

    def _forward_backward(self, blocks, context, total_weight, skip_sync: bool, mark=_no_mark):
        """One micro-batch's drafter forward, loss and backward: (its share of the loss, its stats)."""
        target_hidden = None
        if self.opts.needs_target_distribution:  # the source also gave the target's final hidden states
            context, target_hidden = context
        autocast = torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)
        with autocast, no_sync(self.model, skip_sync):
            out = drafter_loss(self.model, self.target.embed_tokens, self.target.lm_head_weight, context,
                               blocks, self.opts, target_hidden)
            loss = out.weighted_ce / total_weight
            mark("drafter_forward")
            (loss * self.ranks.world).backward()  # DDP averages over ranks; we want the global sum
        return loss.detach(), acceptance_stats(out.correct, out.valid, blocks.keep)

    def graph_body(self, inputs: tuple[torch.Tensor, ...], context, step_number: torch.Tensor):
        """The whole step of one micro-batch on one rank as device work only (what ``GraphedStep``
        captures): blocks, weight, forward, backward, clipping and the optimizer update. The LR
        schedule and the gradients' reset stay outside (the graph's gradients are overwritten by
        each replay). Returns (loss, stats, grad norm, ok)."""
        blocks = self.blocks(inputs)
        loss, stats = self._forward_backward(blocks, context, self.global_weight([blocks]), False)
        grad_norm = self._update(loss, step_number)
        return loss, stats, grad_norm, self.last_ok

    def _graphed(self, micro_batch: MicroBatch, batch: DeviceBatch, features, step_number: int) -> StepResult:
        context = features(micro_batch, batch.input_ids, batch.attention_mask)
        loss, stats, grad_norm, ok = self.graph(batch.tensors(), context, step_number)
        self.last_ok = ok
        self.scheduler.step()
        return StepResult(loss, [stats], grad_norm, batch.kept)

    def _update(self, step_loss: torch.Tensor, step_number: torch.Tensor) -> torch.Tensor:
        """Clip, then step, unless the loss or the gradient norm is not finite.

        Deciding that on the host would cost a device synchronization every step (the
        trainer has none: the loop syncs only at log lines). So the decision stays on the
        device: the clip already reduces every gradient to one norm; ``ok`` is two more
        scalar ops on it and the (already reduced, identical on every rank) loss. The fused
        AdamW kernel (and Muon, ``train/muon.py``) takes it as ``found_inf`` (the mechanism AMP's GradScaler uses): a bad
        step leaves weights, moments and the step count untouched. The host reads the
        counters in ``bad`` (updated in place: a CUDA graph writes the same tensor) at the next
        log line or save (``Trainer.check_bad_steps``), where it synchronizes anyway. The LR
        schedule advances on a skipped step (its data is consumed). Without such an optimizer
        the host decides, at the price of a sync. ``step_number``: a device scalar.
        """
        grad_norm = clip_gradients(self.optimizer, self.drafter.parameters(), self.grad_clip)
        ok = torch.isfinite(step_loss) & torch.isfinite(grad_norm)
        self.last_ok = ok
        bad = ~ok
        first = bad & (self.bad[0] == 0)
        values = torch.stack([self.bad[0] + bad, step_number.to(self.bad.dtype), step_loss.float(), grad_norm.float()])
        self.bad.copy_(torch.where(torch.stack([bad, first, first, first]), values, self.bad))
        if skips_on_device(self.optimizer):
            self.optimizer.found_inf = bad.float()
            self.optimizer.step()
        elif bool(ok):
            self.optimizer.step()
        return grad_norm
