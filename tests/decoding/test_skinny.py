"""Few-row matmul formulations == F.linear; the static decoder with each == plain greedy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.decoding.skinny import (
    make_linear,
    skinny_linear,
    split_count,
    split_k_linear,
    transposed_linear,
)
from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.models.target import Target


@pytest.mark.parametrize("rows", [2, 16, 64])
@pytest.mark.parametrize("k,n", [(576, 1536), (1536, 576), (256, 40)])
def test_formulations_equal_linear(rows, k, n):
    g = torch.Generator().manual_seed(rows + k)
    x, w, b = torch.randn(1, rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    ref = (x.double() @ w.double().T + b.double()).float()
    torch.testing.assert_close(split_k_linear(x, w, b, split_count(k)), ref, atol=2e-4, rtol=1e-5)
    torch.testing.assert_close(transposed_linear(x, w, None), ref - b, atol=2e-4, rtol=1e-5)
    assert split_k_linear(x, w, b, split_count(k)).shape == (1, rows, n)


def test_split_count_and_dispatch():
    assert split_count(576) == 4 and split_count(1536) == 8 and split_count(64) == 1
    calls = []
    fake = make_linear("splitk", lambda x, w, b=None: calls.append(x.shape) or F.linear(x, w, b))
    w = torch.randn(8, 576)
    fake(torch.randn(1, 576), w)  # one row (a plain step): the original
    fake(torch.randn(16, 576).bfloat16(), w.bfloat16())  # not float32: the original
    fake(torch.randn(16, 576), w)  # split: never reaches the original
    assert calls == [(1, 576), (16, 576)]


def test_context_restores_linear_and_checks_mode():
    original = F.linear
    with skinny_linear("splitk"):
        assert F.linear is not original
        assert torch.nn.Linear(576, 4)(torch.randn(3, 576)).shape == (3, 4)
    assert F.linear is original
    with pytest.raises(ValueError, match="linear mode"), skinny_linear("tf32"):
        pass


@pytest.mark.parametrize("linear,fused", [("splitk", False), ("mm_t", False), ("splitk", True)])
def test_static_decoder_tokens_equal_reference(linear, fused):
    """hidden 256 / MLP 512: the split path runs (K = 256 and 512 split in 2 and 4)."""
    target = Target(tiny_qwen3(hidden=256, vocab=128))
    drafter = tiny_drafter(target, block_size=8, seed=1)[0]
    decoder = StaticDecoder(target, drafter, max_len=64, mode="eager", linear=linear, fuse_projections=fused)
    for seed in range(3):
        ids = torch.randint(0, 127, (1, 5 + seed), generator=torch.Generator().manual_seed(seed))
        ref = speculative_generate(target, drafter, ids, 24)
        out = decoder.speculative(ids, 24)
        assert out.tokens == ref.tokens == target_generate(target, ids, 24).tokens
        assert out.acceptance_lengths == ref.acceptance_lengths
    assert F.linear is torch.nn.functional.linear


def test_eval_layout_auto():
    """eval's defaults: split-K + fused projections for float32 on CUDA only; explicit wins."""
    from types import SimpleNamespace

    from dflash_train.eval.evaluate import static_layout

    def fake(device, dtype):
        return SimpleNamespace(device=torch.device(device), lm_head_weight=torch.empty(0, dtype=dtype))

    assert static_layout("auto", None, fake("cuda", torch.float32)) == ("splitk", True)
    assert static_layout("auto", None, fake("cuda", torch.bfloat16)) == ("default", True)
    assert static_layout("auto", None, fake("cpu", torch.float32)) == ("default", False)
    assert static_layout("mm_t", False, fake("cuda", torch.float32)) == ("mm_t", False)


def test_non_contiguous_input():
    """A strided activation (a slice of a wider tensor) goes through both formulations."""
    wide = torch.randn(16, 2 * 576)
    x, w = wide[:, ::2], torch.randn(40, 576)
    ref = (x.double() @ w.double().T).float()
    torch.testing.assert_close(split_k_linear(x, w, None, 4), ref, atol=2e-4, rtol=1e-5)
    torch.testing.assert_close(transposed_linear(x, w, None), ref, atol=2e-4, rtol=1e-5)
