"""Mixture-of-experts targets inside CUDA graphs: an experts kernel that never syncs.

transformers runs a MoE layer's experts through the kernel named by
``config._experts_implementation``. The default, ``grouped_mm``, is capture-safe in
bfloat16 only: for other dtypes (float32, eval's lossless mode) ``torch._grouped_mm``
copies the per-expert offsets to the host, which a CUDA graph capture refuses. The
``batched_mm`` kernel gathers each (token, expert) pair's weights instead: no host sync,
the same products summed in the same order per token. It gathers one weight matrix per
pair, so it is used only for the captured steps (16 tokens at most); prompts run with the
model's own kernel (:func:`own_experts`).
"""

from __future__ import annotations

import contextlib

import torch

CAPTURE_SAFE = "batched_mm"


def _implementation(model):
    return getattr(model.config, "_experts_implementation", None)


def needs_capture_safe_experts(model, dtype: torch.dtype, use_graph: bool) -> bool:
    """True when ``model`` runs grouped_mm experts in a dtype whose kernel syncs the host."""
    return use_graph and dtype != torch.bfloat16 and _implementation(model) == "grouped_mm"


@contextlib.contextmanager
def experts_as(model, implementation: str | None):
    """Run ``model``'s experts with ``implementation`` inside the block (``None``: unchanged)."""
    own = _implementation(model)
    if implementation is None or implementation == own:
        yield
        return
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if implementation not in ALL_EXPERTS_FUNCTIONS:
        raise RuntimeError(f"this transformers version has no '{implementation}' experts kernel; "
                           "evaluate the MoE target in bfloat16 or without CUDA graphs")
    model.config._experts_implementation = implementation
    try:
        yield
    finally:
        model.config._experts_implementation = own
