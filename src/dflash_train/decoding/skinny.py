"""Other formulations of the few-row matmuls of verify and draft steps.

A verify step sends B (16) rows through every linear layer of the target, a draft step
B rows through the drafter's. In float32 cuBLAS serves a 16 x 576 x 1536 product with a
CUDA-core kernel of 32 x 128 tiles: 12 thread blocks on a 132-SM H200, each walking all
of K (profiled on an H200: 52 us a call, 4.7 of the verify step's 7.3 ms in such
GEMMs, against 0.74 ms for the plain step's 210 GEMVs). The same arithmetic can be
spread differently:

* ``splitk``: cut K into ``s`` slices, one batched GEMM over the slices (``s`` times the
  thread blocks), then a sum over them;
* ``mm_t``: compute ``(W x^T)^T``, so the long dimension N is cuBLAS's M and gets the
  tiles;
* ``cublaslt``: cuBLASLt's heuristics instead of cuBLAS's for every matmul.

Tried and not kept: one Triton kernel a product (all rows in one tile, each program walking
all of K with float32 FMAs; commit 9cfc70f): 21 us a product on an H200 against ~10 for
split-K's GEMM + sum, a SmolLM2 verify step 5.47 ms against 4.26
(docs/results/smollm2-h200-13/steps-fp32.json).

All are float32 throughout (no TF32): the result differs from ``F.linear`` only in the
order of the additions, so greedy verification stays exact up to ties at the rounding
level, which the lossless check watches. :func:`skinny_linear` applies one inside a
``with`` block (the decoder wraps its captured steps in it); rows outside
``2..MAX_ROWS`` and non-float32 inputs keep ``F.linear``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

LINEAR_MODES = ("default", "cublaslt", "splitk", "mm_t")
MAX_ROWS = 64
MIN_SLICE = 128  # split K only into slices of at least this many


def check_linear_mode(mode: str) -> str:
    if mode not in LINEAR_MODES:
        raise ValueError(f"linear mode must be one of {LINEAR_MODES}, got {mode!r}")
    return mode


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, slices: int) -> torch.Tensor:
    """``F.linear`` with K cut into ``slices``: [s, m, K/s] @ [s, K/s, N] summed over s."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    parts = torch.bmm(rows.reshape(-1, slices, k // slices).transpose(0, 1),
                      weight.reshape(n, slices, k // slices).permute(1, 2, 0))
    out = parts.sum(0)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], n)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` as ``(W x^T)^T``: N (long) becomes cuBLAS's M."""
    n, k = weight.shape
    out = torch.mm(weight, x.reshape(-1, k).t()).t()
    if bias is not None:
        out = out + bias
    return out.contiguous().reshape(*x.shape[:-1], n)


def split_count(k: int) -> int:
    """The most slices (at most 8) that divide K into pieces of >= MIN_SLICE; 1 = no split."""
    return next((s for s in (8, 6, 4, 3, 2) if k % s == 0 and k // s >= MIN_SLICE), 1)


def make_linear(mode: str, original=F.linear):
    """An ``F.linear`` replacement for ``mode`` ("splitk" or "mm_t")."""
    def linear(x, weight, bias=None):
        rows = x.numel() // x.shape[-1] if x.dim() else 0
        if not (2 <= rows <= MAX_ROWS and x.dtype == torch.float32 and weight.dim() == 2):
            return original(x, weight, bias)
        if mode == "mm_t":
            return transposed_linear(x, weight, bias)
        slices = split_count(weight.shape[1])
        return original(x, weight, bias) if slices == 1 else split_k_linear(x, weight, bias, slices)
    return linear


@contextlib.contextmanager
def skinny_linear(mode: str = "default"):
    """Inside the block, few-row float32 matmuls use ``mode`` (see the module docstring).
    ``F.linear`` is patched on ``torch.nn.functional`` (what ``nn.Linear`` calls) and
    restored on exit; "cublaslt" switches the BLAS front end instead."""
    if check_linear_mode(mode) == "default":
        yield
        return
    if mode == "cublaslt":
        before = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            yield
        finally:
            torch.backends.cuda.preferred_blas_library(before)
        return
    original = F.linear
    F.linear = make_linear(mode, original)
    try:
        yield
    finally:
        F.linear = original
