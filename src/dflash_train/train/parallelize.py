"""Activation checkpointing, compilation and data parallelism, applied to the drafter in one place.

Order matters (as in torchtitan): checkpoint-wrap each decoder layer first, then
compile each wrapped layer. Dynamo then traces the non-reentrant checkpoint as a
higher-order op inside the layer graph, including the flex_attention call, so no
FX tracer ever meets an already-compiled function -- the failure other trainers hit
("Detected that you are using FX to symbolically trace a dynamo-optimized
function") came from checkpointing around compiled code. Per-layer compilation
compiles one graph (all layers share code and shapes) and keeps compile time short;
``dynamic=False`` because every batch has static shapes (fixed anchor width).

One graph means identical inputs for every layer, requires-grad flags included: layer 0
reads the frozen embedding of the block tokens (no grad) while the other layers read
their predecessor's output (grad), and AOTAutograd builds a different joint graph for
each, so the layer compiled twice (forward and backward). A pre-hook on the drafter makes
the block embeddings a grad-requiring leaf in training. The only extra work is the input
gradient of layer 0's q/k/v projections on the block rows (the MLP's input gradient is
needed anyway): ~0.3% of a reference step, against a second compile of the whole layer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.nn.parallel import DistributedDataParallel


def apply_activation_checkpointing(drafter: nn.Module) -> None:
    for index, layer in enumerate(drafter.layers):
        drafter.layers[index] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def _block_embeds_require_grad(_module, args):
    """Forward pre-hook: in training, the block embeddings (first argument) require grad, as
    every later layer's input does, so that all layers share one compiled graph."""
    if torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor) and not args[0].requires_grad:
        return (args[0].detach().requires_grad_(), *args[1:])
    return None


def apply_compile(drafter: nn.Module, mode: str = "default") -> None:
    """``mode="reduce-overhead"``: Inductor also records each layer's compiled forward and backward
    as CUDA graphs (one per layer; parameters are static inputs) and replays them, so the host no
    longer launches each kernel: for a small drafter the host, not the GPU, bounds the step. The
    step must then call ``torch.compiler.cudagraph_mark_step_begin()`` first (``step_begin``)."""
    drafter.register_forward_pre_hook(_block_embeds_require_grad)
    for layer in drafter.layers:  # in place: parameter names (checkpoints, export) stay unchanged
        layer.compile(dynamic=False, mode=None if mode == "default" else mode)


def compile_target_if(target, cfg, device: torch.device) -> bool:
    """Apply ``target.compile`` (``cfg``: the ``TargetConfig``) where it runs: on CUDA, as ``train.compile``.
    Returns whether the target's layers are compiled."""
    if cfg.compile and device.type == "cuda":
        apply_target_compile(target)
    return bool(getattr(target, "layers_compiled", False))


def apply_target_compile(target) -> None:
    """``target.compile``: compile each of the frozen target's decoder layers (``dynamic=False``).

    Half of a large target's forward runs outside its matmuls (norms, rotary, activations, residual
    adds, each a pass over memory); compiled, Inductor fuses them around the matmuls and attention, and
    an FP8 target's activation quantization (``models/fp8.FP8Linear``) joins the norm before it. The
    layer's ``forward`` is compiled, not the module's call: the feature hooks (``Target._capture``) are
    registered and removed at every forward and stay outside the graph, so they cannot invalidate it.
    All layers share code and shapes: one graph for all of them (a second one for packed rows, whose
    attention mask is a tensor), compiled at the first forward; the parameter names do not change."""
    if getattr(target, "layers_compiled", False):  # the launcher compiled it before the trainer got it
        return
    for layer in target.layers:
        layer.forward = torch.compile(layer.forward, dynamic=False)
    target.layers_compiled = True


def step_begin(compile_mode: str):
    """What a training step must call first, or None: a new CUDA-graph generation under reduce-overhead."""
    return torch.compiler.cudagraph_mark_step_begin if compile_mode == "reduce-overhead" else None


@dataclass
class DataParallel:
    """How the drafter is replicated over the drafter ranks: DDP (default) or FSDP2."""

    group: object  # the drafter ranks' process group
    device: torch.device
    fsdp: bool = False


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


def _mesh(group, device: torch.device):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, device.type)


def apply_fsdp(drafter: nn.Module, group, device: torch.device) -> None:
    """FSDP2: one unit per drafter layer plus the root. It reduce-scatters the MEAN gradient,
    like DDP, so the trainer's ``* world`` scaling holds for both."""
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh(group, device)
    for layer in drafter.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(drafter, mesh=mesh)


def parallelize_target(target, group, device: torch.device) -> None:
    """FSDP2 over the target's decoder layers only (forward only, resharded after each layer).

    The embedding, final norm and lm_head stay whole on every rank: the drafter reads them
    directly. Every rank must run the same number of target forwards (true when colocated).
    """
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh(group, device)
    for layer in target.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)


def no_sync(model: nn.Module, skip: bool):
    """Skip the gradient all-reduce of a micro-batch that is not the step's last (DDP, FSDP2)."""
    if not skip:
        return contextlib.nullcontext()
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDP2 module
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def parallelize_drafter(drafter: nn.Module, activation_checkpointing: bool, compile: bool,
                        data_parallel: DataParallel | None = None, compile_mode: str = "default",
                        fp8: bool = False, fp8_emulate: bool = False) -> nn.Module:
    """FP8 projections, checkpoint-wrap, compile, then replicate or shard; returns the module a
    step calls (DDP's wrapper, or the drafter itself). Call it before the optimizer exists: FSDP2
    replaces the parameters by sharded ones, which the optimizer must hold.

    ``fp8`` (``train.fp8_drafter``): the drafter layers' attention and MLP projections compute
    their forward and backward GEMMs in FP8 (``models/fp8.use_fp8_training_linears``). First, so
    that checkpointing and compilation wrap the swapped modules; the parameters stay the same
    objects under the same names. ``fp8_emulate``: the float32 emulation (CPU tests, the bench)."""
    if fp8:
        from dflash_train.models.fp8 import use_fp8_training_linears

        use_fp8_training_linears(drafter, emulate=fp8_emulate)
    if activation_checkpointing:
        apply_activation_checkpointing(drafter)
    if compile:
        apply_compile(drafter, compile_mode)
    if data_parallel is None:
        return drafter
    if data_parallel.fsdp:
        apply_fsdp(drafter, data_parallel.group, data_parallel.device)
        return drafter
    device = data_parallel.device
    return DDP(drafter, device_ids=[device.index] if device.type == "cuda" else None,
               process_group=data_parallel.group)
