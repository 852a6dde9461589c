"""Static-shape greedy decoding == the reference loops (tokens, acceptance, drafter cache)."""

from __future__ import annotations

import pytest
import torch
from testkit import random_prompts, tiny_drafter, tiny_qwen3

from dflash_train.decoding.speculative import DFlashProposer, speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.models.target import Target

VOCAB = 128


@pytest.fixture(scope="module")
def target():
    return Target(tiny_qwen3(vocab=VOCAB))


def prompts(n, seed=0):
    return random_prompts(n, seed, VOCAB)


def test_plain_equals_reference_and_reuses_buffers(target):
    decoder = StaticDecoder(target, tiny_drafter(target, block_size=4)[0], max_len=64, mode="eager")
    for ids in prompts(4, seed=1):  # one decoder, several prompts: stale cache entries must stay invisible
        ref = target_generate(target, ids, 20, record_topk=3)
        out = decoder.plain(ids, 20, record_topk=3)
        assert out.tokens == ref.tokens
        torch.testing.assert_close(out.topk_values, ref.topk_values, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_speculative_equals_reference(target, block_size, layer_types):
    """Same drafts at every step as the HF-cache loop, so the same tokens and acceptance
    lengths; a trained-looking drafter is not needed: equality of the step-by-step
    acceptance lengths pins the drafter's context cache, positions and masks."""
    drafter, _ = tiny_drafter(target, block_size=8, layer_types=layer_types,
                              sliding_window=3 if layer_types else None, seed=2)
    decoder = StaticDecoder(target, drafter, max_len=80, block_size=block_size, mode="eager")
    for ids in prompts(4, seed=block_size):
        ref = speculative_generate(target, drafter, ids, 24, block_size=block_size)
        out = decoder.speculative(ids, 24)
        assert out.tokens == ref.tokens == target_generate(target, ids, 24).tokens
        assert out.acceptance_lengths == ref.acceptance_lengths
        assert out.position_reached == ref.position_reached and out.position_accepted == ref.position_accepted


class RecordingProposer(DFlashProposer):
    """The reference proposer, keeping each step's greedy drafts."""

    def __init__(self, target, drafter):
        super().__init__(target, drafter)
        self.drafts = []

    def propose_block(self, tokens, new_features, num_draft, sampling):
        proposal = super().propose_block(tokens, new_features, num_draft, sampling)
        self.drafts.append(proposal.tokens.tolist())
        return proposal


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
def test_every_step_drafts_equal_reference(target, layer_types):
    """Acceptance is mostly 1 with an untrained drafter, so compare what the drafter
    proposes at every step: its context cache, positions and masks must match the
    reference's exactly for all B-1 drafts, not only the first."""
    drafter, _ = tiny_drafter(target, block_size=6, layer_types=layer_types,
                              sliding_window=3 if layer_types else None, seed=3)
    decoder = StaticDecoder(target, drafter, max_len=96, mode="eager")
    mine = []
    real_draft = decoder._draft
    decoder._draft = lambda *a: mine.append(real_draft(*a).tolist()) or torch.tensor(mine[-1])
    for ids in prompts(3, seed=11):
        reference = RecordingProposer(target, drafter)
        ref = speculative_generate(target, reference, ids, 40)
        mine.clear()
        out = decoder.speculative(ids, 40)
        assert out.tokens == ref.tokens
        assert mine == reference.drafts and len(mine) == ref.num_steps


def test_length_and_mode_checks(target):
    drafter = tiny_drafter(target, block_size=4)[0]
    decoder = StaticDecoder(target, drafter, max_len=32, mode="eager")
    with pytest.raises(ValueError, match="max_len"):
        decoder.speculative(torch.zeros(1, 20, dtype=torch.long), 16)
    with pytest.raises(ValueError, match="block_size"):
        StaticDecoder(target, drafter, max_len=32, block_size=1)
    with pytest.raises(ValueError, match="cudagraph"):
        StaticDecoder(target, drafter, max_len=32, mode="cudagraph")

    with pytest.raises(ValueError, match="compile_steps"):
        StaticDecoder(target, drafter, max_len=32, mode="eager", compile=True, compile_steps=("prefill",))


def test_compile_draft_step_only(target):
    """``compile_steps=("draft",)``: the drafter's step runs compiled, the target's plain
    and verify steps keep their uncompiled functions, and the tokens and acceptance
    lengths stay the reference's."""
    drafter, _ = tiny_drafter(target, block_size=4, seed=5)
    decoder = StaticDecoder(target, drafter, max_len=64, mode="eager", compile=True, compile_steps=("draft",))
    assert decoder.compile_steps == ("draft",)
    assert decoder.draft_step.compiled and decoder.draft_step.fn is not decoder.draft_step.eager_fn
    for step in (decoder.plain_step, decoder.verify_step):
        assert not step.compiled and step.fn is step.eager_fn
    ids = prompts(1, seed=21)[0]
    ref = speculative_generate(target, drafter, ids, 16)
    out = decoder.speculative(ids, 16)
    assert decoder.draft_step.compiled, "the compiled draft step fell back to eager"
    assert out.tokens == ref.tokens and out.acceptance_lengths == ref.acceptance_lengths
