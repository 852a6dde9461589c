"""``auto`` devices and dtypes, resolved in one place for every command.

``auto`` device: CUDA when available, else the CPU. ``auto`` dtype: bf16 on CUDA (the
tensor cores' format), float32 elsewhere (CPU bf16 matmuls are slow and less exact).
"""

from __future__ import annotations

import contextlib
import gc

import torch


def resolve_device(name: str | None, what: str = "train.device") -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{what}={name}: CUDA is not available here (torch {torch.__version__}); "
                         f"use cpu or auto")
    return device


def resolve_dtype(name: str, device: torch.device | str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise ValueError(f"unknown dtype {name!r}: use auto, bfloat16, float16 or float32")
    return getattr(torch, name)


def synchronize(device: torch.device | str) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA): timers read after this are honest."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def to_device_async(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` without the host waiting for the device.

    A copy from pageable host memory to a GPU can drain the stream first even with
    ``non_blocking`` (the driver stages the bytes through its own pinned buffer), and then the GPU
    idles while the host launches the next kernels: at every training step, when the step's
    anchors or a batch that no prefetcher pinned are copied. A host tensor is copied into pinned
    memory first (PyTorch's caching host allocator keeps that buffer until the copy is done).
    Measured on the reference bench (H200, FP8 target): the GPU idled ~14 ms of each 192 ms step
    with pageable copies, ~5 ms with pinned ones (docs/results, 2026-12-04, second session)."""
    if device.type != "cuda":
        return tensor.to(device)
    if not tensor.is_cuda and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


@contextlib.contextmanager
def graph_capture(graph, **kwargs):
    """``torch.cuda.graph(graph, **kwargs)`` with Python's garbage collector held off.

    A collection inside a capture can free an unreachable object that owns a CUDA graph or
    device memory (an earlier decoder in a reference cycle, say), and freeing device memory
    invalidates the capture ("operation failed due to a previous error during capture"; seen
    on an H200 in the GPU suite). ``torch.cuda.graph`` no longer collects first
    (``torch.compiler.config.force_cudagraph_gc`` is off by default), so this does: it
    collects what is already garbage, then allows no collection until the capture ends."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    finally:
        if enabled:
            gc.enable()
