"""Activation checkpointing and compilation, applied to the drafter in one place.

Order matters (as in torchtitan): checkpoint-wrap each decoder layer first, then
compile each wrapped layer. Dynamo then traces the non-reentrant checkpoint as a
higher-order op inside the layer graph, including the flex_attention call, so no
FX tracer ever meets an already-compiled function -- the failure other trainers hit
("Detected that you are using FX to symbolically trace a dynamo-optimized
function") came from checkpointing around compiled code. Per-layer compilation
compiles one graph (all layers share code and shapes) and keeps compile time short;
``dynamic=False`` because every batch has static shapes (fixed anchor width).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper


def apply_activation_checkpointing(drafter: nn.Module) -> None:
    for index, layer in enumerate(drafter.layers):
        drafter.layers[index] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def apply_compile(drafter: nn.Module) -> None:
    for layer in drafter.layers:
        layer.compile(dynamic=False)  # in place: parameter names (checkpoints, export) stay unchanged


def parallelize_drafter(drafter: nn.Module, activation_checkpointing: bool, compile: bool) -> nn.Module:
    if activation_checkpointing:
        apply_activation_checkpointing(drafter)
    if compile:
        apply_compile(drafter)
    return drafter
