"""Replay and the split-K static decoder on CUDA with the real SmolLM2 (float32).

    python -m pytest -m gpu tests/gpu/test_gpu_replay.py -q
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from dflash_train.decoding.speculative import DFlashProposer, speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.eval.replay import block_states, greedy_references, replay_one, replay_one_batched
from dflash_train.models.target import Target
from dflash_train.testing import tiny_drafter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
TEXTS = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def pair():
    if not (SMOLLM2 / "config.json").exists():
        pytest.skip("assets/smollm2 missing")
    torch.backends.cuda.matmul.allow_tf32 = False
    target = Target.load(SMOLLM2, dtype=torch.float32, device="cuda")
    drafter = tiny_drafter(target, num_layers=4, block_size=16, seed=5)[0].cuda().eval()
    return target, drafter


def _ids(target, text):
    return target.tokenizer(text, return_tensors="pt").input_ids.cuda()


def test_batched_blocks_equal_drafting(pair):
    """One training-style forward over all blocks == drafting block by block (dense mask
    through CUDA SDPA vs the cached decode path), and the two walks agree."""
    target, drafter = pair
    ids = _ids(target, TEXTS[1])
    n, num_draft = 48, 15
    cont = target_generate(target, ids, n + num_draft + 1).tokens
    sequence, prompt_len = ids[0].tolist() + cont, ids.shape[1]
    anchors = list(range(prompt_len, prompt_len + n))
    states = block_states(target, drafter, sequence, anchors, num_draft)
    features = target.features(torch.tensor([sequence[: anchors[-1]]], device="cuda"), None,
                               drafter.config.target_layer_ids)
    proposer, fed = DFlashProposer(target, drafter), 0
    for i, p in enumerate(anchors):
        logits = proposer.propose(sequence[: p + 1], features[:, fed:p], num_draft)
        fed = p
        torch.testing.assert_close(states[i] @ target.lm_head_weight.T, logits, atol=2e-3, rtol=1e-3)
    walked = replay_one(target, DFlashProposer(target, drafter), ids.cpu(), cont, n, num_draft, set())
    assert replay_one_batched(target, drafter, ids.cpu(), cont, n, num_draft, set()).acceptance_lengths == \
        walked.acceptance_lengths


def test_static_references_equal_reference_loop(pair):
    target, drafter = pair
    ids = [_ids(target, t)[0].cpu() for t in TEXTS]
    assert greedy_references(target, ids, 48, engine="static", drafter=drafter) == \
        greedy_references(target, ids, 48, engine="hf")


@pytest.mark.parametrize("linear", ["splitk", "triton"])
@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "compiled+graphs"])
def test_split_k_fused_decoder_equals_reference(pair, compile, linear):
    """eval's CUDA layouts for float32 (split-K or the Triton kernel for few-row matmuls, fused
    projections), with and without compiled steps (everything compiled: the custom op inside
    inductor's graph): the reference loop's tokens and acceptance lengths."""
    target, drafter = pair
    decoder = StaticDecoder(target, drafter, max_len=192, mode="cudagraph", compile=compile, linear=linear,
                            fuse_projections=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="static eval")
        for text in TEXTS:
            ids = _ids(target, text)
            ref = speculative_generate(target, drafter, ids, 64)
            out = decoder.speculative(ids, 64)
            assert out.tokens == ref.tokens == decoder.plain(ids, 64).tokens
            assert out.acceptance_lengths == ref.acceptance_lengths


@pytest.mark.parametrize("rows", [2, 15, 16, 33])
def test_few_rows_kernel_on_cuda(rows):
    """The Triton kernel compiled for the GPU on SmolLM2's product shapes (fused q/k/v, o,
    gate/up, down, lm_head): equal to a float64 product up to float32 rounding, the same bits
    at every call, and inside a captured CUDA graph."""
    from dflash_train.decoding.few_rows import few_rows_linear

    g = torch.Generator(device="cuda").manual_seed(rows)
    for k, n in [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)]:
        x = torch.randn(1, rows, k, device="cuda", generator=g)
        w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
        out = few_rows_linear(x, w)
        ref = (x.double() @ w.double().T).float()
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
        assert torch.equal(out, few_rows_linear(x, w))
    graph = torch.cuda.CUDAGraph()
    few_rows_linear(x, w)  # compiled before capture
    with torch.cuda.graph(graph):
        captured = few_rows_linear(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(captured, (x.double() @ w.double().T).float(), atol=2e-5, rtol=1e-5)
