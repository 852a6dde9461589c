"""One Triton kernel for the few-row float32 products of verify and draft steps.

Why a kernel of our own: a verify step of SmolLM2 sends 16 rows through 121 products
(4 per layer with fused projections, plus the lm_head). cuBLAS has no good float32
tiling for 16 rows (:mod:`.skinny`), and the split-K formulation needs two kernels a
product (the sliced GEMM, then the sum over slices), each a few microseconds of a step
that is launch-bound. Here one program owns ``BLOCK_N`` output columns for all rows
and walks the whole of K, so a product is one launch, the weight is read once, and
every output is one float32 dot product accumulated in a fixed order (FMA, no TF32:
``input_precision="ieee"``), deterministic from call to call. ``BLOCK_N`` shrinks for
narrow outputs so that even a 576-column product spreads over dozens of SMs.

:func:`few_rows_linear` is a ``torch.library`` custom op: ``torch.compile`` (the draft
step) treats it as one opaque kernel, and a CUDA graph captures its launch like any
other. It needs Triton and a CUDA tensor, or ``TRITON_INTERPRET=1`` (Triton's CPU
interpreter, which the CPU tests use to check the kernel's indexing and masks against a
float64 reference). :func:`available` says whether it can run on a device.
"""

from __future__ import annotations

import functools
import os

import torch

from .skinny import MAX_ROWS  # BLOCK_M holds every row: more would spill the register tile


@functools.cache
def _triton():
    """The Triton module, or None without one (the op then refuses to run)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device | str) -> bool:
    """Whether :func:`few_rows_linear` runs on ``device``: Triton on CUDA, or the
    interpreter on the CPU."""
    device = torch.device(device)
    if _triton() is None:
        return False
    return device.type == "cuda" or (device.type == "cpu" and interpreted())


@functools.cache
def _kernel(interpret: bool):
    """The jitted kernel; built apart for the interpreter (``triton.jit`` reads
    ``TRITON_INTERPRET`` when it decorates), so a CPU check never leaks into CUDA calls."""
    triton, tl = _triton()

    @triton.jit
    def few_rows_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_om,
                        K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
        rows = tl.arange(0, BLOCK_M)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        depth = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + depth
            x = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :],
                        mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
            w = tl.load(w_ptr + cols[None, :] * stride_wn + k[:, None],
                        mask=(cols[None, :] < N) & (k[:, None] < K), other=0.0)
            acc += tl.dot(x, w, input_precision="ieee")
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0)[None, :]
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
                 mask=(rows[:, None] < M) & (cols[None, :] < N))

    return few_rows_kernel


def block_sizes(rows: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): all rows in one tile (at least 16, tl.dot's minimum),
    and columns per program chosen so that there are >= ~64 programs when N allows."""
    block_m = max(16, 1 << (rows - 1).bit_length())
    block_n = 16 if n <= 4096 else 32 if n <= 8192 else 64
    return block_m, block_n, 64


@torch.library.custom_op("dflash_train::few_rows_linear", mutates_args=())
def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for float32 ``x`` of 1..MAX_ROWS rows (all leading
    dimensions together), in one kernel launch."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = rows.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"few_rows_linear: {m} rows, expected 1..{MAX_ROWS}")
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    block_m, block_n, block_k = block_sizes(m, n)
    _kernel(interpreted())[(-(-n // block_n),)](
        rows, weight, bias if bias is not None else weight, out, m, n,
        rows.stride(0), weight.stride(0), out.stride(0),
        K=k, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out.reshape(*x.shape[:-1], n)


@few_rows_linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty(*x.shape[:-1], weight.shape[0])
