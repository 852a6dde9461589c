"""The training job's configuration: nested dataclasses, YAML/JSON files, overrides.

A job is ``JobConfig`` = target + drafter + data + optim + train (+ eval). It comes
from a named recipe (``recipes/*.yaml`` inside the package) or a file, then
``key.sub=value`` overrides from the command line. Unknown keys and impossible
combinations raise ``ValueError`` saying what to fix; ``validate`` runs before any
model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from torch import device as torch_device

from dflash_train.data import DataConfig
from dflash_train.files import UserFacingError, read_text
from dflash_train.models.config import DrafterConfig
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.tracking.registry import DEFAULT_LOGGERS, TrackingSettings, check_config


def _refuse_fp8_on_cpu(key: str, device: str) -> None:
    """An FP8 key with ``train.device=cpu``: the CPU has no FP8 tensor cores (``auto`` resolving
    to the CPU is refused later, where the model is placed)."""
    if device == "cpu":
        raise ValueError(f"{key} needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+); "
                         f"train.device=cpu has none: set {key}=false")


@dataclass
class TargetConfig:
    path: str = ""  # the target: a Hugging Face model folder or a .gguf file (required)
    gguf_file: str | None = None  # the .gguf file's name inside ``path`` when ``path`` is a folder
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 on CPU
    # The linear layers of the target's decoder layers (attention and MLP projections; never the
    # embedding, lm_head or MoE routers) as FP8 e4m3 matmuls with per-row scales (models/fp8.py):
    # weights quantized once at load (half their memory), activations per token at each call;
    # features move by a few percent relative RMS. CUDA with compute capability 8.9+ only. On the
    # reference bench (H200) it saves memory (30.8 against 37.3 GiB) and, with target.compile, time:
    # 16,103 context tok/s against 14,508 for the compiled bf16 target
    # (docs/results/fp8-h200/2026-12-04b/ref-fp8-ct.json, ref-bf16-ct.json); without target.compile it
    # was slower than bf16, 10,820 against 12,860 (docs/results/fp8-h200/ref-target-fp8.json,
    # ref-bf16.json, the code of 2026-12-03).
    fp8_linear: bool = False
    # CUDA only: torch.compile each decoder layer of the frozen target (train/parallelize.py,
    # apply_target_compile): norms, rotary, activations and residual adds fuse around the matmuls, and
    # with fp8_linear the activation quantization fuses into them. One more graph to compile at the first
    # step (one for all layers).
    compile: bool = False

    def validate(self) -> None:
        if not self.path:
            raise ValueError("target.path is required (a HF model folder or a .gguf file)")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"target.dtype must be auto/float32/bfloat16/float16, got {self.dtype!r}")
        for key in ("fp8_linear", "compile"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"target.{key} must be true or false, got {getattr(self, key)!r}")
        if self.fp8_linear and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(f"target.fp8_linear needs target.dtype auto or bfloat16, got {self.dtype}: the "
                             "rowwise FP8 matmul returns bfloat16, so a float32/float16 target would only be "
                             "rounded through bfloat16 at every layer")

    def validate_with(self, train: TrainConfig) -> None:
        """The target's keys against the training ones (``JobConfig.validate``). FP8 linears need
        FP8 tensor cores: the CPU has none (its exact emulation exists for tests, slower than
        float32 and less exact, so it is refused here; ``auto`` resolving to the CPU is refused
        when the target loads). Their weights are FP8 buffers, not parameters, so they cannot
        seed the drafter (``drafter_init=target`` copies parameters) and FSDP2 would not shard them."""
        if not self.fp8_linear:
            return
        _refuse_fp8_on_cpu("target.fp8_linear", train.device)
        if train.drafter_init == "target":
            raise ValueError("target.fp8_linear and train.drafter_init=target: the drafter would start from "
                             "FP8-rounded copies that are not parameters; use one or the other")
        if train.fsdp_target:
            raise ValueError("target.fp8_linear and train.fsdp_target: FSDP2 shards parameters, and the FP8 "
                             "weights are buffers, so every rank would hold all of them; use one or the other")


@dataclass
class OptimConfig:
    # adamw, or muon: Muon for the drafter's weight matrices, AdamW for its norm gains (train/muon.py);
    # lr, betas, weight_decay and the schedule apply to both (Muon's update is scaled to AdamW's RMS)
    name: str = "adamw"
    lr: float = 6e-4  # peak learning rate (after warmup, before the cosine decay)
    weight_decay: float = 0.0  # decoupled weight decay (AdamW's; Muon's matrices too)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW's betas
    warmup_ratio: float = 0.04  # share of the steps (or of the time budget) in linear warmup
    min_lr_ratio: float = 0.0  # the cosine schedule's final learning rate, as a share of lr
    grad_clip: float = 1.0  # clip the gradient's global norm to this (0: no clipping)
    momentum: float = 0.95  # Muon's (Nesterov) momentum; AdamW uses betas

    def validate(self) -> None:
        if self.name not in ("adamw", "muon"):
            raise ValueError(f"optim.name must be adamw or muon, got {self.name!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"optim.momentum must be in [0, 1), got {self.momentum}")
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"optim.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        betas = self.betas
        if (not isinstance(betas, tuple | list) or len(betas) != 2
                or not all(isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), e.g. [0.9, 0.95], got {betas!r}")


@dataclass
class _TrainHead:
    """``TrainConfig``'s keys up to ``loggers``. A base class only so that the tracking backends' keys
    (``tracking.registry.TrackingSettings``, the next base) come right after ``loggers`` in every
    listing (docs/config.md, ``dflash-train config``, a run's saved config): a dataclass lists its
    bases' fields before its own."""

    run_dir: str = "runs/dflash"  # the run folder: checkpoints, metrics, config, summary (one run at a time: a lock)
    seed: int = 0  # seeds the drafter's init, the anchors and the batch order
    epochs: float = 1.0  # passes over the data (max_steps / the time budget may stop earlier)
    max_steps: int | None = None  # overrides epochs when set
    # > 0: a wall-clock budget for the training steps (evaluation, checkpoints and the first,
    # compiling step excluded; ranks agree on the max). The run stops when it is spent, and the
    # LR schedule runs on max(step / steps, time / budget), so warmup and cosine decay
    # complete inside the budget whatever the hardware's speed.
    time_budget_minutes: float = 0.0
    grad_accum: int = 1  # micro-batches per optimizer step
    num_anchors: int = 512  # blocks sampled per row of a micro-batch
    anchors: str = "random"  # "random" (paper) or "uniform" (ablation: fixed blocks)
    device: str = "auto"  # auto (cuda if available, else cpu), cpu, cuda or cuda:N
    attention: str = "auto"  # auto: flex on CUDA, sdpa (dense mask) elsewhere
    compile: bool = True  # torch.compile the drafter layers and the loss chunks (CUDA only)
    # The drafter layers' inductor mode: "default", or "reduce-overhead" (CUDA graphs of each layer's
    # forward and backward: no per-kernel launch cost on the host; train/parallelize.py)
    compile_mode: str = "default"
    # CUDA only: replay the frozen target's forward over packed rows as a CUDA graph (its eager forward
    # is host-bound for a small target; train/cuda_graphs.py). A capture failure falls back to eager.
    cuda_graphs: bool = True
    # CUDA only: replay the drafter's whole step (forward, loss, backward, clipping, fused AdamW) as one
    # CUDA graph after two eager steps (train/cuda_graphs.GraphedStep). One process, one micro-batch
    # per step, no kl/tv objective target; other set-ups, a capture failure or another batch shape run eagerly.
    cuda_graph_step: bool = True
    compile_artifacts: str | None = None  # a compile-artifacts.bin from another run: start warm
    activation_checkpointing: bool = False  # recompute drafter layers in backward (long context)
    log_every: int = 10  # steps between metric lines
    # Where the metric records go (tracking/): jsonl (RUN/metrics.jsonl, always on even when left
    # out: the resume and the summary read it), tensorboard (RUN/tensorboard), wandb, mlflow (pip install
    # dflash-train[wandb] / [mlflow]). Only the main rank logs; a backend that cannot start stops the run
    # before the target loads, one that fails mid-run is a warning and is dropped
    loggers: list[str] = field(default_factory=lambda: list(DEFAULT_LOGGERS))


@dataclass
class TrainConfig(TrackingSettings, _TrainHead):
    """The ``train`` section. Its keys: ``_TrainHead``'s (``run_dir`` ... ``loggers``), then each tracking
    backend's own (``wandb_project``, ``mlflow_tracking_uri``, ...), then these. A backend's keys are the
    fields of the ``train_keys`` dataclass in its module (tracking/wandb.py's ``WandbSettings``,
    tracking/mlflow.py's ``MlflowSettings``), with their meanings; ``tracking.registry.TrackingSettings``
    joins them, so a new backend's keys need no line here."""

    progress: bool = True  # a progress bar on the terminal
    save_every_steps: int = 0  # 0: only at the end (and on SIGTERM/SIGINT)
    save_every_minutes: float = 0.0  # of training time (agreed by all ranks), like time_budget_minutes
    keep_last: int = 2  # checkpoints kept (older ones are pruned)
    # Steps whose loss or gradient norm is not finite: their optimizer update is skipped on the
    # device; more than this many in a run stop it with an error naming the first (0: the first stops it).
    max_bad_steps: int = 0
    resume: str | None = None  # a checkpoint folder, or "auto" for the newest in run_dir
    init_from: str | None = None  # a DFlash serving folder to warm-start the drafter
    # "target": drafter layer i starts as target layer L - N + i, the final norm as the target's
    # (models/target_init.py); "random": the usual init. A resumed run loads its checkpoint over it.
    drafter_init: str = "random"
    # "device" / "cpu": keep every conversation's target features after its first epoch (on the training
    # device / in host memory) and skip the target forward when a micro-batch is all cached
    # (train/features.py, SampleFeatureCache: exact, memory = dataset tokens x feature width); "disk": the
    # hybrid mode, online in the first epoch while writing the feature store train.feature_store names, then
    # from that store (features/hybrid.py: any size, kept for later runs); "off": recompute
    feature_cache: str = "off"
    # feature_cache=device only: at most this many GiB of the cache on the GPU (the dataset's first
    # tokens); the rest spills to host memory, read back ahead of each step (null: sized from the card,
    # its free memory less 12% of it for the step: ~124 GiB on an H200, ~69 on an H100 80GB)
    feature_cache_gib: float | None = None
    # A feature store written by `dflash-train features` (features/): train from its features, with no
    # target forward and only the target's embedding, final norm and lm_head loaded; refused, naming the
    # field, when it was written for another target, layers, tokenizer, max_length or data (null: the target)
    feature_store: str | None = None
    # feature_cache=disk only: the encoding the first epoch writes (features --dtype: auto, bfloat16, float8)
    feature_store_dtype: str = "auto"
    fsdp_drafter: bool = False  # distributed: shard the drafter with FSDP2 instead of DDP
    fsdp_target: bool = False  # distributed, colocated: shard the target's decoder layers with FSDP2
    # The drafter layers' attention and MLP projections compute forward AND backward in FP8 e4m3 with
    # rowwise scales (models/fp8.py, torchao's "rowwise" recipe); the master weights keep their dtype and
    # are re-quantized every call. Not fc, the embedding, lm_head or DFlash2's small projections.
    # Experimental: keep it only where the loss curve and held-out tau match a run without it; slower
    # than bf16 so far (reference bench, H200, the code of 2026-12-03: 9,639 context tok/s against 12,860;
    # docs/results/fp8-h200/ref-drafter-fp8.json, ref-bf16.json).
    # CUDA with compute capability 8.9+ only; not with fsdp_drafter.
    fp8_drafter: bool = False

    @property
    def loads_target_layers(self) -> bool:
        """Whether the job runs the target: not when every step reads a feature store (only the
        target's embedding, final norm and lm_head load then); the hybrid mode runs it in its first epoch."""
        return not self.feature_store or self.feature_cache == "disk"

    def validate(self) -> None:
        self._validate_lengths()
        self._validate_choices()
        self._validate_feature_cache()
        self._validate_loggers()
        for name in ("fsdp_drafter", "fsdp_target", "fp8_drafter"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"train.{name} must be true or false, got {getattr(self, name)!r}")
        self._validate_fp8_drafter()

    def _validate_lengths(self) -> None:
        """How long the run is, how often it logs and saves."""
        if self.epochs <= 0 and not self.max_steps:
            raise ValueError("train.epochs must be > 0 (or set train.max_steps)")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"train.max_steps must be >= 1, got {self.max_steps}")
        for name in ("grad_accum", "num_anchors", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("save_every_steps", "save_every_minutes", "max_bad_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0 (0: off), got {getattr(self, name)}")
        if self.time_budget_minutes < 0:
            raise ValueError(f"train.time_budget_minutes must be >= 0 (0: no budget), got {self.time_budget_minutes}")

    def _validate_choices(self) -> None:
        """The keys that name one of a few ways: device, anchors, compile, attention, initialization."""
        if self.device != "auto":
            try:
                torch_device(self.device)
            except RuntimeError:
                raise ValueError(f"train.device must be auto, cpu, cuda or cuda:N, got {self.device!r}") from None
        if self.anchors not in ("random", "uniform"):
            raise ValueError(f"train.anchors must be 'random' or 'uniform', got {self.anchors!r}")
        if self.compile_mode not in ("default", "reduce-overhead"):
            raise ValueError(f"train.compile_mode must be default or reduce-overhead, got {self.compile_mode!r}")
        if self.attention not in ("auto", "sdpa", "flex"):
            raise ValueError(f"train.attention must be auto/sdpa/flex, got {self.attention!r}")
        if self.drafter_init not in ("random", "target"):
            raise ValueError(f"train.drafter_init must be 'random' or 'target', got {self.drafter_init!r}")
        if self.drafter_init == "target" and self.init_from:
            raise ValueError("train.drafter_init=target and train.init_from both set the drafter's weights; "
                             "choose one")

    def _validate_feature_cache(self) -> None:
        if self.feature_cache not in ("off", "device", "cpu", "disk"):
            raise ValueError(f"train.feature_cache must be off, device, cpu or disk, got {self.feature_cache!r}")
        if self.feature_store_dtype not in ("auto", "bfloat16", "float8"):
            raise ValueError("train.feature_store_dtype must be auto, bfloat16 or float8, got "
                             f"{self.feature_store_dtype!r}")
        if self.feature_store_dtype != "auto" and self.feature_cache != "disk":
            raise ValueError("train.feature_store_dtype is the encoding train.feature_cache=disk writes; it has "
                             f"no use with feature_cache={self.feature_cache} (dflash-train features --dtype "
                             "chooses a dumped store's)")
        if self.feature_cache == "disk" and not self.feature_store:
            raise ValueError("train.feature_cache=disk writes its first epoch's features to a feature store: name "
                             "its folder with train.feature_store=PATH")
        if self.feature_cache_gib is not None:
            if self.feature_cache != "device":
                raise ValueError("train.feature_cache_gib caps the GPU part of train.feature_cache=device; "
                                 f"it has no use with feature_cache={self.feature_cache}")
            if not self.feature_cache_gib >= 0:
                raise ValueError(f"train.feature_cache_gib must be >= 0, got {self.feature_cache_gib}")
        if self.feature_store is not None:
            if not isinstance(self.feature_store, str) or not self.feature_store:
                raise ValueError(f"train.feature_store must be a folder path or null, got {self.feature_store!r}")
            if self.feature_cache in ("device", "cpu"):
                raise ValueError("train.feature_store reads every step's features from disk: train.feature_cache "
                                 "has nothing to keep; set it off (or disk: write the store in the first epoch)")
            if self.feature_cache == "disk":
                return  # the hybrid mode loads the whole target: its first epoch runs it
            if self.drafter_init == "target" or self.fsdp_target:
                raise ValueError("train.feature_store loads no target layers, and train.drafter_init=target / "
                                 "train.fsdp_target need them; use drafter_init=random, fsdp_target=false")

    def _validate_loggers(self) -> None:
        """Known backends, each once; each backend's own keys (tracking/: the wandb mode one wandb knows)."""
        check_config(self)

    def _validate_fp8_drafter(self) -> None:
        """FP8 GEMMs need FP8 tensor cores: the CPU has none (its exact emulation exists for tests,
        slower than float32 and less exact, so it is refused here; ``auto`` resolving to the CPU is
        refused when the drafter is prepared). FSDP2 would hand the layers sharded parameters to
        gather and quantize per rank, a combination nothing here has checked."""
        if not self.fp8_drafter:
            return
        _refuse_fp8_on_cpu("train.fp8_drafter", self.device)
        if self.fsdp_drafter:
            raise ValueError("train.fp8_drafter and train.fsdp_drafter: FP8 drafter layers are checked with "
                             "one process and DDP only; use one or the other")


@dataclass
class EvalConfig:
    """Held-out speculative decoding during training (real tau, not only accuracy)."""

    prompts: str | None = None  # chat file or one prompt per line; None disables
    every: int = 0  # steps between evaluations (0: only before and after training)
    every_minutes: float = 0.0  # or minutes of training time between evaluations (0: off)
    num_prompts: int = 8  # held-out prompts per in-training evaluation
    max_new_tokens: int = 64  # tokens generated per prompt
    at_start: bool = True  # evaluate once before the first step (tau of an untrained drafter)

    def validate(self) -> None:
        if self.every < 0 or self.every_minutes < 0:
            raise ValueError("eval.every and eval.every_minutes must be >= 0 (0: off)")
        for name in ("num_prompts", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"eval.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class JobConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> None:
        self.validate_step()
        self.data.validate()
        if self.data.max_length <= self.drafter.block_size:
            raise ValueError(
                f"data.max_length ({self.data.max_length}) must exceed drafter.block_size ({self.drafter.block_size})"
            )
        self.eval.validate()
        if self.train.feature_store and self.train.feature_cache != "disk" and self.eval.prompts:
            raise ValueError("train.feature_store loads no target layers, and eval.prompts decodes with the whole "
                             "target: set eval.prompts=null and evaluate the export (dflash-train eval)")

    def validate_step(self) -> None:
        """The sections a training step is assembled from (target, drafter, optim, train, objective):
        all ``validate`` checks but the data's and the evaluation's. The benchmark checks only these:
        it times the step on synthetic rows, so it reads no data set and evaluates nothing."""
        self.target.validate()
        self.target.validate_with(self.train)
        self.drafter.validate()
        self.optim.validate()
        self.train.validate()
        self.objective.validate()
        self.objective.validate_with(self.drafter.block_size, self.drafter.kind)
        if self.train.feature_cache in ("device", "cpu") and self.objective.needs_target_distribution:
            raise ValueError("train.feature_cache stores features only; objective.targets kl/tv also need the "
                             "target's final hidden states at every step: use one or the other")
        if self.train.attention == "flex" and self.train.device == "cpu":
            raise ValueError("train.attention=flex has no CPU backward; use train.attention=sdpa on CPU")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {f.name: f.type for f in dataclasses.fields(JobConfig)}
def _moved_keys() -> dict[tuple[str, str], str]:
    """Keys that were removed, by (section, key), and what took their place (the one-line error names
    it): each kind's settings into ``drafter.options``, the loss's keys into ``objective``, and more."""
    from dflash_train.models.kinds import KINDS

    moved = {("drafter", name): f"drafter.options.{name} (with drafter.kind={kind.name})"
             for kind in KINDS.values() for name in kind.options}
    return {**moved, **{("train", old): new for old, new in _MOVED_FROM_TRAIN.items()}}


_MOVED_FROM_TRAIN = {
    "gamma": "objective.gamma", "loss_positions": "objective.loss_positions", "dpace_alpha": "objective.dpace_alpha",
    "loss_chunk_size": "objective.chunk_size", "reach_weighting": "objective.weighting: reach",
    "objective": "objective.weighting (ce: decay, dpace: dpace)",
    "selector_out_of_topk": "objective.kind.selector_out_of_topk (with drafter.kind=dflash2)",
    "distill": "objective.targets: train.distill=d is {ce: 1 - d, kl: d}",
    "tensorboard": "train.loggers (without TensorBoard: train.loggers=[jsonl])",
}


MOVED = _moved_keys()


def _build(cls, data: dict[str, Any], where: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in set(data) - set(known))
    moved = [f"{where}.{k} is now {MOVED[where, k]}" for k in unknown if (where, k) in MOVED]
    if moved:
        raise ValueError("; ".join(moved))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; known: {sorted(known)}")
    kwargs = {}
    for name, value in data.items():
        if name == "betas" and isinstance(value, list):
            value = tuple(value)
        value = _text(_yaml_word(value, str(known[name].type)), str(known[name].type), f"{where}.{name}")
        _check_bool(value, str(known[name].type), f"{where}.{name}")
        kwargs[name] = _coerce_number(value, str(known[name].type), f"{where}.{name}")
    return cls(**kwargs)


def _yaml_word(value: Any, annotation: str) -> Any:
    """A text field written ``off`` or ``on``: YAML 1.1 reads those words (and yes/no) as booleans,
    so ``train.feature_cache=off`` arrived as False; a text field gets the word back."""
    kinds = {part.strip() for part in annotation.split("|")}
    if isinstance(value, bool) and kinds <= {"str", "None"}:
        return "on" if value else "off"
    return value


def _text(value: Any, annotation: str, key: str) -> Any:
    """A text field (a path, a name): a number YAML read (``train.run_dir=2024``) is the text it
    was written as; a list or mapping is refused here, naming the key, not deep in a later step."""
    kinds = {part.strip() for part in annotation.split("|")}
    if not kinds or not kinds <= {"str", "None"} or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{key} must be text, got {type(value).__name__} {_short(value)}")


def _check_bool(value: Any, annotation: str, key: str) -> None:
    """A yes/no field takes true or false only: YAML reads ``maybe`` as text, which Python
    would then treat as true."""
    kinds = {part.strip() for part in annotation.split("|")}
    if "bool" in kinds and kinds <= {"bool", "None"} and value is not None and not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")


def _coerce_number(value: Any, annotation: str, key: str) -> Any:
    """Numbers written as text: YAML 1.1 reads ``1e-3`` (no dot) as a string. A numeric
    field gets the number it means, or a ``ValueError`` naming the key (never a TypeError
    later): integers must be whole, floats finite, and booleans are not numbers."""
    kinds = {part.strip() for part in annotation.split("|")}
    numeric = kinds & {"float", "int"}
    if not numeric or value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"{key} must be a number, got {value!r}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    if "float" not in numeric:  # an int field
        if isinstance(number, float) and not number.is_integer():
            raise ValueError(f"{key} must be a whole number, got {value!r}")
        return int(number)
    return number


def config_from_dict(data: dict[str, Any]) -> JobConfig:
    sections = {"target": TargetConfig, "drafter": DrafterConfig, "data": DataConfig, "optim": OptimConfig,
                "train": TrainConfig, "objective": ObjectiveConfig, "eval": EvalConfig}
    unknown = sorted(str(k) for k in set(data) - set(sections))
    if unknown:
        raise ValueError(f"unknown config section(s) {unknown}; known: {sorted(sections)}")
    for name, value in data.items():
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"config section {name} must hold key: value pairs, got {type(value).__name__} "
                             f"{_short(value)}")
    job = JobConfig(**{name: _build(cls, data.get(name) or {}, name) for name, cls in sections.items()})
    keep_eval_prompts_out(job)
    return job


def keep_eval_prompts_out(job: JobConfig) -> None:
    """Add the job's ``eval.prompts`` (a file) to ``data.exclude_prompts``, so that no training
    record asks a prompt the job evaluates on; the packaged sets are excluded anyway."""
    from dflash_train.data.prompt_sets import NAMED_PROMPT_SETS

    prompts, excluded = job.eval.prompts, job.data.exclude_prompts
    if (isinstance(prompts, str) and prompts not in NAMED_PROMPT_SETS and isinstance(excluded, list)
            and prompts not in excluded):
        excluded.append(prompts)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def recipe_names() -> list[str]:
    folder = resources.files("dflash_train") / "recipes"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


MAX_CONFIG_BYTES = 1 << 20  # a job config is a few KB; more is another file given by mistake


def _parse_config(path: Path, text: str) -> Any:
    """JSON or YAML; deep nesting (RecursionError) and parse errors become one line."""
    try:
        return (json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)) or {}
    except (ValueError, yaml.YAMLError) as err:  # (ValueError: JSON, and a 5,000-digit number)
        raise UserFacingError(f"config {path}: cannot read it: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                              f"{' '.join(str(err).split())}; fix the file") from None
    except RecursionError:
        raise UserFacingError(f"config {path}: nested too deeply to be a job config; fix the file") from None


def read_config_file(path_or_recipe: str) -> dict[str, Any]:
    """A YAML/JSON file, or the name of a packaged recipe (see ``recipe_names()``). A path that
    is there but cannot be followed (a dangling link, a link loop) is named as such."""
    path = Path(path_or_recipe)
    if path.exists() or os.path.lexists(path):
        data = _parse_config(path, read_text(path, "config", MAX_CONFIG_BYTES))
        if not isinstance(data, dict):
            raise ValueError(f"config {path}: expected sections (target, drafter, ...), got {type(data).__name__}")
        return data
    if path_or_recipe in recipe_names():
        text = (resources.files("dflash_train") / "recipes" / f"{path_or_recipe}.yaml").read_text()
        return yaml.safe_load(text) or {}
    raise FileNotFoundError(f"no config file or recipe named {path_or_recipe!r}; recipes: {recipe_names()}")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``section.key=value`` pairs (``section.key.inner=value`` for a mapping such as
    ``drafter.options``); values parse as YAML (numbers, lists, null, bools)."""
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ValueError(f"override {item!r} must look like section.key=value (e.g. train.max_steps=100)")
        dotted, raw = item.split("=", 1)
        section, *inner, key = dotted.split(".")
        place = data.setdefault(section, {})
        if not isinstance(place, dict):
            raise ValueError(f"override {item!r}: {section} is not a section")
        for name in inner:  # a mapping inside a section: drafter.options.selector_top_k=8
            place = place.setdefault(name, {})
            if not isinstance(place, dict):
                raise ValueError(f"override {item!r}: {name} does not hold keys")
        try:
            place[key] = yaml.safe_load(raw)
        except (ValueError, yaml.YAMLError) as err:
            raise ValueError(f"override {item!r}: the value is not valid YAML ({' '.join(str(err).split())}); "
                             f"quote it, e.g. {dotted}='\"...\"'") from None
        except RecursionError:
            raise ValueError(f"override {item!r}: the value is nested too deeply") from None
    return data


def load_config(path_or_recipe: str | None, overrides: list[str] = (), step_only: bool = False) -> JobConfig:
    """The job a recipe or file and its overrides describe, validated (``step_only``: only the
    sections a training step is assembled from, ``JobConfig.validate_step``: the benchmark's)."""
    data = read_config_file(path_or_recipe) if path_or_recipe else {}
    cfg = config_from_dict(apply_overrides(data, list(overrides)))
    try:
        if step_only:
            cfg.validate_step()
        else:
            cfg.validate()
    except TypeError as err:  # a value of a type no check above expected: still one line
        raise ValueError(f"config: a value has the wrong type ({err}); check the types of the keys you set") from None
    return cfg


def job_from_args(args) -> JobConfig:
    """The job a ``train`` command line names (one process or torchrun): ``args.config`` (a file or
    a recipe), ``args.overrides``, and ``--resume`` as ``train.resume``."""
    overrides = list(args.overrides)
    if getattr(args, "resume", None):
        overrides.append(f"train.resume={args.resume}")
    return load_config(args.config, overrides)
