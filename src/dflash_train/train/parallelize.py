"""Activation checkpointing and compilation, applied to the drafter in one place.

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

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper


def apply_activation_checkpointing(drafter: nn.Module) -> None:
    for index, layer in enumerate(drafter.layers):
        drafter.layers[index] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def _block_embeds_require_grad(_module, args):
    """Forward pre-hook: in training, the block embeddings (first argument) require grad, as
    every later layer's input does, so that all layers share one compiled graph."""
    if torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor) and not args[0].requires_grad:
        return (args[0].detach().requires_grad_(), *args[1:])
    return None


def apply_compile(drafter: nn.Module) -> None:
    drafter.register_forward_pre_hook(_block_embeds_require_grad)
    for layer in drafter.layers:
        layer.compile(dynamic=False)  # in place: parameter names (checkpoints, export) stay unchanged


def parallelize_drafter(drafter: nn.Module, activation_checkpointing: bool, compile: bool) -> nn.Module:
    if activation_checkpointing:
        apply_activation_checkpointing(drafter)
    if compile:
        apply_compile(drafter)
    return drafter
