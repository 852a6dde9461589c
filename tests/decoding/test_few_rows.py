"""The few-row Triton kernel (decoding/few_rows.py) on the CPU through Triton's interpreter:
the kernel's indexing, masks and tiles against a float64 product, the custom op's fake
(compile) side, the dispatch, and the static decoder with it == plain greedy. The same
kernel compiled for a GPU: tests/gpu/test_gpu_replay.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from dflash_train.decoding import few_rows  # noqa: E402

if not few_rows.interpreted():
    pytest.skip("runs kernels on the CPU: needs TRITON_INTERPRET=1 before triton's import (tests/conftest.py sets "
                "it where CUDA is missing); on a GPU see tests/gpu/test_gpu_replay.py", allow_module_level=True)
from dflash_train.decoding.skinny import make_linear  # noqa: E402
from dflash_train.decoding.speculative import speculative_generate, target_generate  # noqa: E402
from dflash_train.decoding.static import StaticDecoder  # noqa: E402
from dflash_train.models.target import Target  # noqa: E402
from dflash_train.testing import tiny_drafter, tiny_qwen3  # noqa: E402


def _reference(x, w, b):
    out = x.double() @ w.double().T
    return (out + b.double() if b is not None else out).float()


# K not a multiple of BLOCK_K (64), N not a multiple of BLOCK_N, rows past one 16-row tile,
# N past 4,096 (wider column blocks)
@pytest.mark.parametrize("rows,k,n", [(1, 64, 16), (2, 100, 40), (16, 130, 200), (33, 64, 17), (3, 70, 4100)])
def test_kernel_equals_float64_reference(rows, k, n):
    g = torch.Generator().manual_seed(rows * 1000 + k)
    x, w, b = torch.randn(1, rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for bias in (None, b):
        out = few_rows.few_rows_linear(x, w, bias)
        assert out.shape == (1, rows, n) and out.dtype == torch.float32
        torch.testing.assert_close(out, _reference(x, w, bias), atol=1e-4, rtol=1e-5)
        assert torch.equal(out, few_rows.few_rows_linear(x, w, bias))  # a fixed order of additions


def test_strided_input_and_row_limit():
    wide = torch.randn(16, 2 * 96)
    x, w = wide[:, ::2], torch.randn(24, 96)  # a slice of a wider activation
    torch.testing.assert_close(few_rows.few_rows_linear(x, w), _reference(x, w, None), atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="rows"):
        few_rows.few_rows_linear(torch.randn(65, 8), torch.randn(4, 8))


def test_block_sizes():
    assert few_rows.block_sizes(16, 576) == (16, 16, 64)
    assert few_rows.block_sizes(17, 49152) == (32, 64, 64)
    assert few_rows.block_sizes(2, 6000) == (16, 32, 64)


def test_custom_op_schema_and_fake():
    """torch.library's own checks (schema, fake tensor, dispatch) on the op: what
    torch.compile relies on to treat it as one opaque kernel in the draft step."""
    x, w, b = torch.randn(16, 80), torch.randn(40, 80), torch.randn(40)
    torch.library.opcheck(few_rows.few_rows_linear, (x, w, b), test_utils=("test_schema", "test_faketensor"))


def test_dispatch_by_rows_and_dtype(monkeypatch):
    calls = []
    monkeypatch.setattr(few_rows, "few_rows_linear", lambda x, w, b=None: calls.append(x.shape) or F.linear(x, w, b))
    linear = make_linear("triton", lambda x, w, b=None: calls.append(("original", *x.shape)) or F.linear(x, w, b))
    w = torch.randn(8, 32)
    linear(torch.randn(1, 32), w)  # one row (a plain step): cuBLAS's GEMV as is
    linear(torch.randn(16, 32).bfloat16(), w.bfloat16())  # not float32: as is
    linear(torch.randn(16, 32), w)
    assert calls == [("original", 1, 32), ("original", 16, 32), (16, 32)]


def test_refused_without_a_device_that_runs_it(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    target = Target(tiny_qwen3(hidden=64, vocab=128))
    drafter = tiny_drafter(target, block_size=4, seed=1)[0]
    assert not few_rows.available("cpu")
    with pytest.raises(ValueError, match="linear='triton' needs Triton and a CUDA device"):
        StaticDecoder(target, drafter, max_len=32, mode="eager", linear="triton")


def test_static_decoder_tokens_equal_reference():
    """Verify and draft steps through the kernel (every product of 2..64 rows; fused projections,
    as eval runs them): the same tokens and acceptance lengths as the reference loop and plain
    greedy decoding. (The interpreter runs a kernel program in ~6 ms: one short prompt.)"""
    target = Target(tiny_qwen3(num_layers=5, hidden=64, vocab=128))
    drafter = tiny_drafter(target, block_size=4, seed=1)[0]
    decoder = StaticDecoder(target, drafter, max_len=32, mode="eager", linear="triton", fuse_projections=True)
    ids = torch.randint(0, 127, (1, 5), generator=torch.Generator().manual_seed(0))
    ref = speculative_generate(target, drafter, ids, 10)
    out = decoder.speculative(ids, 10)
    assert out.tokens == ref.tokens == target_generate(target, ids, 10).tokens
    assert out.acceptance_lengths == ref.acceptance_lengths and len(out.acceptance_lengths) >= 3
