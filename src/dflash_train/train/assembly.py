"""One assembly of a run from its job config: target, drafter config, drafter, step, data.

Three programs put a run together: the trainer (``train/trainer.py``), a disaggregated target rank
(``distributed/disagg.TargetServer``: the target, the drafter config its drafter ranks resolve, and
their batch plan, no step) and the benchmark (``bench/run.py``: the trainer's step on synthetic
rows). Each used to do it its own way, and what one could set the others could not (the benchmark
could not time ``objective.dpace_alpha`` or a kind's terms). Every rule of the assembly lives here
instead, once: the mask token's choice and the layer ids' check; the seed before the drafter's
init, the warm start or the copy of target layers; the order FP8 projections, checkpointing,
compilation, then DDP/FSDP2; the step's objective, anchors and attention from ``objective:``,
``train:`` and ``optim:``; when the whole step is replayed as a CUDA graph. So a benchmark times the
step a job would train, and a target rank computes the layers its drafter ranks read.

``assemble`` is the entry point (trainer and benchmark); the target server calls its first halves,
``resolve_drafter`` and ``load_data``. The model files stay free of training code: ``models/``
builds networks from a ``DrafterConfig`` and knows no job config (torchtitan's separation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from dflash_train.config import JobConfig, TargetConfig
from dflash_train.devices import resolve_dtype
from dflash_train.models.config import DrafterConfig, resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.models.target import Target, choose_mask_token_id
from dflash_train.train.optim import skips_on_device
from dflash_train.train.parallelize import DataParallel, compile_target_if, parallelize_drafter
from dflash_train.train.step import StepSpec, TrainStep, build_train_step


def _silent(*_args, **_kwargs) -> None:
    pass


# -- the target --------------------------------------------------------------------------------------
def load_target(cfg: TargetConfig, device: torch.device, dtype: torch.dtype, layers: bool = True) -> Target:
    """The job's frozen target from ``target.path`` (its FP8 linears where ``target.fp8_linear`` asks).
    ``layers=False`` (training from a feature store): its embedding, final norm and lm_head only."""
    if not layers:
        return Target.load_head(cfg.path, dtype, device, cfg.gguf_file)
    return Target.load(cfg.path, dtype, device, cfg.gguf_file, fp8_linear=cfg.fp8_linear)


def target_dtype(cfg: JobConfig, device: torch.device) -> torch.dtype:
    """``target.dtype`` on ``device`` (auto: bfloat16 on CUDA, float32 elsewhere): the target's weights
    and the step's autocast."""
    return resolve_dtype(cfg.target.dtype, device)


# -- the drafter config ------------------------------------------------------------------------------
def resolve_drafter(cfg: DrafterConfig, target: Target, echo=_silent) -> DrafterConfig:
    """``drafter:`` with every null field taken from the target, the mask token chosen from its
    tokenizer unless given, and the feature layers checked against its layers. The drafter ranks and
    the target ranks of a disaggregated run both call this: they must agree on the layers."""
    mask_id, reason = None, "given in the config"
    if cfg.mask_token_id is None:
        mask_id, reason = choose_mask_token_id(target.tokenizer, target.facts.vocab_size)
    resolved = resolve_drafter_config(cfg, target.facts, mask_id)
    target.validate_layer_ids(resolved.target_layer_ids)
    echo(f"drafter: {resolved.num_hidden_layers} layers, block {resolved.block_size}, target layers "
         f"{resolved.target_layer_ids}, mask token {resolved.mask_token_id} ({reason})")
    return resolved


# -- the drafter ----------------------------------------------------------------------------------------
def build_drafter(cfg: JobConfig, drafter_cfg: DrafterConfig, target: Target, device: torch.device,
                  echo=_silent) -> DFlashDrafter:
    """The drafter's fp32 master weights on ``device``: initialized on the CPU after
    ``torch.manual_seed(train.seed)`` (the same weights whatever the device), then the warm start
    (``train.init_from``) or the target's layers (``train.drafter_init=target``). Before any wrapping
    and before the optimizer: a resume loads its checkpoint over these."""
    torch.manual_seed(cfg.train.seed)
    drafter = DFlashDrafter(drafter_cfg).to(device)
    if cfg.train.init_from:
        from dflash_train.export.serving import load_drafter_folder

        loaded, _ = load_drafter_folder(cfg.train.init_from, target)
        drafter.load_state_dict(loaded.state_dict())
        echo(f"warm start from {cfg.train.init_from}")
    elif cfg.train.drafter_init == "target":
        from dflash_train.models.target_init import init_from_target

        ids = init_from_target(drafter, target)
        echo(f"drafter layers start as target layers {ids} and its final norm (train.drafter_init=target)")
    return drafter


def step_spec(cfg: JobConfig, drafter_cfg: DrafterConfig, compiled: bool, device: torch.device) -> StepSpec:
    """What the step is made of besides its modules, from ``objective:`` and ``train:``. Flex
    attention has no CPU backward: refused here, before any step runs, whoever asked for it."""
    spec = StepSpec.from_job(cfg.objective, cfg.train, drafter_cfg.block_size, drafter_cfg.mask_token_id, compiled)
    if spec.options(device).attention == "flex" and device.type != "cuda":
        raise ValueError(f"train.attention=flex has no backward on {device.type}: use train.attention=sdpa "
                         "(or auto)")
    return spec


# -- the whole --------------------------------------------------------------------------------------------
@dataclass
class Assembled:
    """A run's parts, built by ``assemble``; ``step`` and ``graph_step`` finish the training step once
    the caller knows its length (the trainer from its data, the benchmark from its flags)."""

    cfg: JobConfig
    target: Target
    drafter_cfg: DrafterConfig
    drafter: DFlashDrafter
    model: nn.Module  # what a step calls: the drafter, or its DDP wrapper
    spec: StepSpec
    device: torch.device
    dtype: torch.dtype

    @property
    def compiled(self) -> bool:
        return self.spec.compiled

    def step(self, total_steps: int, ranks, time_fraction=None) -> TrainStep:
        """The training step with its optimizer (``optim:``) and LR schedule over ``total_steps``."""
        return build_train_step(self.spec, self.model, self.drafter, self.target, self.cfg.optim, total_steps,
                                self.device, self.dtype, ranks, time_fraction)

    def graph_step(self, step: TrainStep, ranks, data_parallel, echo=_silent, capture=None) -> bool:
        """Replay ``step`` as one CUDA graph (``train.cuda_graph_step``) where it can be captured whole:
        CUDA, one process, one micro-batch per step, no kl/tv target (its features are a pair),
        Inductor's own graphs off (``compile_mode=default``), and an optimizer that reads ``found_inf``
        on the device (the fused AdamW, Muon). Elsewhere the step runs eagerly, said once on CUDA.
        ``capture``: a stand-in for the CUDA capture (CPU tests), which lifts the CUDA condition."""
        t = self.cfg.train
        if not t.cuda_graph_step:
            return False
        why_not = [reason for reason, failed in (
            ("not on CUDA", self.device.type != "cuda" and capture is None),
            ("several ranks", ranks.world > 1 or data_parallel is not None),
            ("train.grad_accum > 1", t.grad_accum > 1),
            ("objective.targets kl/tv (the target's distribution)", step.opts.needs_target_distribution),
            ("train.compile_mode=reduce-overhead", t.compile_mode != "default"),
            ("an optimizer that cannot skip a step on the device", not skips_on_device(step.optimizer))) if failed]
        if why_not:
            if self.device.type == "cuda":
                echo(f"train.cuda_graph_step: the step runs eagerly ({', '.join(why_not)})")
            return False
        step.graph_whole_step(capture=capture)
        echo("train.cuda_graph_step: after 2 eager steps every step replays as one CUDA graph")
        return True


def assemble(cfg: JobConfig, target: Target, device: torch.device, data_parallel: DataParallel | None = None,
             echo=_silent, emulate_fp8: bool = False) -> Assembled:
    """Target (compiled where ``target.compile`` says), resolved drafter config, drafter and its
    wrapping, and the step's spec, from one job config. ``data_parallel``: DDP or FSDP2 over the
    drafter ranks. ``emulate_fp8``: ``train.fp8_drafter``'s float32 emulation where the device has no
    FP8 products (the benchmark's CPU runs; a job refuses FP8 on the CPU)."""
    compile_target_if(target, cfg.target, device)
    drafter_cfg = resolve_drafter(cfg.drafter, target, echo)
    drafter = build_drafter(cfg, drafter_cfg, target, device, echo)
    t = cfg.train
    compiled = t.compile and device.type == "cuda"
    model = parallelize_drafter(drafter, t.activation_checkpointing, compiled, data_parallel, t.compile_mode,
                                fp8=t.fp8_drafter, fp8_emulate=emulate_fp8)
    return Assembled(cfg, target, drafter_cfg, drafter, model, step_spec(cfg, drafter_cfg, compiled, device),
                     device, target_dtype(cfg, device))


# -- the data ----------------------------------------------------------------------------------------------
@dataclass
class RunData:
    """The tokenized set and its batch plan (``data:``, seeded by ``train.seed``), the same on every
    rank: a drafter rank walks its share, a target rank the concatenation of every drafter's."""

    dataset: object
    report: object
    plan: object
    pad_id: int

    def batches(self, rank: int, world: int, micro_batches_per_step: int):
        from dflash_train.data import BatchIterator

        return BatchIterator(self.dataset, self.plan, pad_id=self.pad_id, rank=rank, world_size=world,
                             micro_batches_per_step=micro_batches_per_step)

    def steps_per_epoch(self, micro_batches_per_step: int) -> int:
        return max(1, len(self.plan.epoch_micro_batches(0)) // micro_batches_per_step)

    def total_steps(self, cfg: JobConfig, micro_batches_per_step: int) -> int:
        """``train.max_steps``, else ``train.epochs`` passes over the plan."""
        return cfg.train.max_steps or max(1, math.ceil(cfg.train.epochs * self.steps_per_epoch(micro_batches_per_step)))


def load_data(cfg: JobConfig, tokenizer, block_size: int) -> RunData:
    """Tokenize ``data:`` (or read its cache) and plan its micro-batches."""
    from dflash_train.data import batch_plan, load_tokenized

    dataset, report = load_tokenized(cfg.data, tokenizer, block_size)
    plan = batch_plan(dataset["length"], cfg.data, cfg.train.seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return RunData(dataset, report, plan, pad_id)
