"""Speculative decoding with a DFlash2 drafter is lossless in every engine.

The drafter's selector is perturbed so that its walk leaves DFlash's per-slot argmax (checked):
the engines must then draft the walk's path (``decoding/choosers/dflash2.SelectorChooser``), and greedy
output must still equal plain greedy decoding, token for token.
"""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.decoding.choosers.dflash2 import SelectorChooser
from dflash_train.decoding.core import block_chooser
from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.models.kinds.dflash2 import selector_walk
from dflash_train.models.target import Target


def _dflash2(target):
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=4, target_layer_ids=[0, 2], kind="dflash2",
                              options={"conv_group_size": 16, "selector_rank": 8, "selector_top_k": 5})
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "candidate_selector" in name or "conv" in name:
                p.normal_(std=0.5)
    return drafter.eval()


@pytest.fixture(scope="module")
def pair():
    target = Target(tiny_qwen3(num_layers=4))
    return target, _dflash2(target)


def _prompts(n=3):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 120, (1, 7), generator=g) for _ in range(n)]


def test_the_engines_choose_with_the_selector(pair):
    _, drafter = pair
    chooser = block_chooser(drafter)
    assert isinstance(chooser, SelectorChooser)
    g = torch.Generator().manual_seed(1)
    hidden, logits = torch.randn(3, 64, generator=g), torch.randn(3, 128, generator=g)
    from dflash_train.decoding.core import GREEDY, Sampling
    greedy = chooser(hidden, logits, torch.tensor([5]), GREEDY)
    path = selector_walk(drafter.candidate_selector, hidden[None], logits[None], torch.tensor([5]))[0][0]
    assert torch.equal(greedy.tokens, path) and greedy.q is None
    sampled = chooser(hidden, logits, torch.tensor([5]), Sampling(temperature=0.7, generator=torch.Generator()))
    assert sampled.q.shape == logits.shape
    assert torch.allclose(sampled.q.sum(-1), torch.ones(3))
    top = torch.topk(logits, 5, dim=-1).indices
    outside = torch.ones_like(sampled.q, dtype=torch.bool).scatter_(-1, top, False)
    assert (sampled.q[outside] == 0).all()  # q lives on the k candidates only
    assert all(int(t) in top[i].tolist() for i, t in enumerate(sampled.tokens))


def test_greedy_dflash2_reference_engine_equals_plain_greedy(pair):
    target, drafter = pair
    left = 0
    for prompt in _prompts():
        spec = speculative_generate(target, drafter, prompt, max_new_tokens=20)
        plain = target_generate(target, prompt, max_new_tokens=20)
        assert spec.tokens == plain.tokens
        left += _walk_left_argmax(target, drafter, prompt)
    assert left > 0  # the selector really chose other tokens than DFlash's argmax


def test_greedy_dflash2_static_engine_equals_reference(pair):
    target, drafter = pair
    decoder = StaticDecoder(target, drafter, max_len=64, mode="eager")
    for prompt in _prompts():
        ref = speculative_generate(target, drafter, prompt, max_new_tokens=20)
        out = decoder.speculative(prompt, 20)
        assert out.tokens == ref.tokens == target_generate(target, prompt, max_new_tokens=20).tokens
        assert out.acceptance_lengths == ref.acceptance_lengths  # same drafts: the selector's path


def _walk_left_argmax(target, drafter, prompt) -> int:
    """How many slots of a first block the walk drafts off the per-slot argmax."""
    from dflash_train.decoding.proposers import as_proposer

    seen = {}
    real = SelectorChooser.__call__

    def spy(self, hidden, logits, anchor, sampling):
        out = real(self, hidden, logits, anchor, sampling)
        seen["off"] = seen.get("off", 0) + int((out.tokens != logits.argmax(-1)).sum())
        return out

    SelectorChooser.__call__ = spy
    try:
        speculative_generate(target, as_proposer(target, drafter), prompt, max_new_tokens=8)
    finally:
        SelectorChooser.__call__ = real
    return seen.get("off", 0)
