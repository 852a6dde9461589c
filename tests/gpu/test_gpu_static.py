"""The static eval engine on CUDA: captured CUDA graphs decode exactly like the reference loops.

    python -m pytest -m gpu tests/gpu -q
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.models.target import Target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
VOCAB = 128


@pytest.fixture(scope="module")
def cuda_pair():
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 everywhere: no near-tie flips between kernels
    target = Target(tiny_qwen3(vocab=VOCAB).cuda())
    drafter, _ = tiny_drafter(target, block_size=8, seed=2)
    return target, drafter.cuda().eval()


def _prompts(n):
    rng = random.Random(7)
    return [torch.tensor([[rng.randrange(VOCAB - 1) for _ in range(rng.randint(1, 12))]], device="cuda")
            for _ in range(n)]


@pytest.mark.parametrize("options", [{}, {"grouped_attention": False}, {"compile": True},
                                     {"compile": True, "fuse_projections": True},
                                     {"compile": True, "compile_steps": ("draft",), "fuse_projections": True}],
                         ids=["cudagraph", "cudagraph-stock-attention", "compile+cudagraph", "compile+fused",
                              "compile-draft+fused"])
def test_cuda_graph_decoding_equals_reference(cuda_pair, options):
    """Graph replays must read the fixed input tensors written before each replay; a graph that
    captured stale inputs or fell back to eager (or to the uncompiled step) would fail the
    equality or the ``use_graph`` / ``compiled`` checks."""
    target, drafter = cuda_pair
    decoder = StaticDecoder(target, drafter, max_len=96, mode="cudagraph", **options)
    with warnings.catch_warnings():
        # a capture or compile failure warns and falls back: make that warning fail here (only
        # that one: inductor's own advice, e.g. about TF32, is a warning too)
        warnings.filterwarnings("error", message="static eval")
        for ids in _prompts(3):
            ref = speculative_generate(target, drafter, ids, 32)
            out = decoder.speculative(ids, 32)
            assert out.tokens == ref.tokens == target_generate(target, ids, 32).tokens
            assert out.acceptance_lengths == ref.acceptance_lengths
            assert decoder.plain(ids, 32).tokens == ref.tokens
    graphs = (decoder.verify_step, decoder.draft_step, decoder.plain_step)
    assert all(step.use_graph and step.graph is not None for step in graphs)
    compiled = options.get("compile_steps", ("verify", "draft", "plain")) if options.get("compile") else ()
    assert [step.compiled for step in graphs] == [name in compiled for name in ("verify", "draft", "plain")]


def test_compiled_graphs_on_smollm2_equal_reference():
    """The eval default on CUDA (compiled steps inside CUDA graphs) on the real target in
    float32: plain greedy's tokens and the reference loop's acceptance lengths."""
    from pathlib import Path

    from testkit import tiny_drafter as make_drafter

    path = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
    if not (path / "config.json").exists():
        pytest.skip("assets/smollm2 missing")
    torch.backends.cuda.matmul.allow_tf32 = False
    target = Target.load(path, dtype=torch.float32, device="cuda")
    drafter = make_drafter(target, num_layers=4, block_size=16, seed=5)[0].cuda().eval()
    decoder = StaticDecoder(target, drafter, max_len=192, mode="cudagraph", compile=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="static eval")
        for text in ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea."]:
            ids = target.tokenizer(text, return_tensors="pt").input_ids.cuda()
            ref = speculative_generate(target, drafter, ids, 64)
            out = decoder.speculative(ids, 64)
            assert out.tokens == ref.tokens == target_generate(target, ids, 64).tokens
            assert out.acceptance_lengths == ref.acceptance_lengths
            assert decoder.plain(ids, 64).tokens == ref.tokens
    assert all(s.compiled and s.graph is not None for s in (decoder.verify_step, decoder.plain_step,
                                                             decoder.draft_step))
