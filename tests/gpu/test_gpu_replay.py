"""Replay and the split-K static decoder on CUDA with the real SmolLM2 (float32).

    python -m pytest -m gpu tests/gpu/test_gpu_replay.py -q
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from testkit import tiny_drafter

from dflash_train.decoding.speculative import DFlashProposer, speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.eval.replay import block_states, greedy_references, replay_one, replay_one_batched
from dflash_train.models.target import Target

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


@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "compiled+graphs"])
def test_split_k_fused_decoder_equals_reference(pair, compile):
    """eval's CUDA default for float32 (split-K few-row matmuls, fused projections), with
    and without compiled steps: the reference loop's tokens and acceptance lengths."""
    target, drafter = pair
    decoder = StaticDecoder(target, drafter, max_len=192, mode="cudagraph", compile=compile, linear="splitk",
                            fuse_projections=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="static eval")
        for text in TEXTS:
            ids = _ids(target, text)
            ref = speculative_generate(target, drafter, ids, 64)
            out = decoder.speculative(ids, 64)
            assert out.tokens == ref.tokens == decoder.plain(ids, 64).tokens
            assert out.acceptance_lengths == ref.acceptance_lengths
