"""The kinds' training terms where mutation testing found them unchecked (issue 60.4).

mutmut over ``objective/kinds/`` left alive: the registry (a kind's entry, DFlash's for a kind with no
file), each kind's settings check (its bounds and words), the DSpark confidence head's loss and its logged
accuracy (a wrong metric is silent), a wrapper's inner module, and the options each term reads. These
compute each by hand on a few rows. The equivalent survivors, and why: ``docs/faults.md`` (item 4).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dflash_train.objective.kinds import ChunkOutputs, KindTerms, TermInputs, terms_of
from dflash_train.objective.kinds.dflash2 import DFlash2Terms, selector_ce
from dflash_train.objective.kinds.dspark import DSparkTerms


def test_each_kind_finds_its_terms_and_an_unknown_one_gets_dflashs():
    assert isinstance(terms_of("dspark"), DSparkTerms) and isinstance(terms_of("dflash2"), DFlash2Terms)
    assert type(terms_of("dflash")) is KindTerms and terms_of("no-such-kind") is terms_of("dflash")
    assert KindTerms().top_k(None) == 0


@pytest.mark.parametrize(("terms", "options", "message"), [
    (KindTerms(), {"x": 1}, "objective.kind: ['x'] are not settings of drafter.kind=dflash's terms (its settings: none)"),
    (DSparkTerms(), {"b": 1, "a": 2}, "objective.kind: ['a', 'b'] are not settings of drafter.kind=dspark's terms "
                                      "(its settings: confidence_weight)"),
    (DSparkTerms(), {"confidence_weight": -0.5}, "objective.kind.confidence_weight must be a number >= 0, got -0.5"),
    (DSparkTerms(), {"confidence_weight": True}, "objective.kind.confidence_weight must be a number >= 0, got True"),
    (DSparkTerms(), {"confidence_weight": "1"}, "objective.kind.confidence_weight must be a number >= 0, got '1'"),
    (DFlash2Terms(), {"selector_out_of_topk": "drop"},
     "objective.kind.selector_out_of_topk must be one of ['inject', 'exclude'], got 'drop'"),
])
def test_a_kinds_settings_are_refused_word_for_word(terms, options, message):
    with pytest.raises(ValueError) as err:
        terms.check_options(options)
    assert str(err.value) == message


@pytest.mark.parametrize(("terms", "options"), [
    (DSparkTerms(), {}), (DSparkTerms(), {"confidence_weight": 0}), (DSparkTerms(), {"confidence_weight": 0.5}),
    (DFlash2Terms(), {}), (DFlash2Terms(), {"selector_out_of_topk": "exclude"}),
    (DFlash2Terms(), {"selector_out_of_topk": "inject"}),
])
def test_a_kinds_defaults_and_bounds_are_accepted(terms, options):
    terms.check_options(options)


class _Confidence(torch.nn.Module):
    """Fixed logits per row, whatever it is given (the arguments are recorded)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, hidden, prev_embed):
        self.seen = (hidden, prev_embed)
        return self.logits


def _dspark(logits):
    markov = SimpleNamespace(embed=lambda prev: prev.float().unsqueeze(-1) * 10)
    return SimpleNamespace(module=SimpleNamespace(markov_head=markov, confidence_head=_Confidence(logits)))


def test_dspark_confidence_loss_and_accuracy_by_hand():
    """Rows: argmax right/wrong/wrong/right/right; confidence logits 2, -1, 0.5, 0, -3 (one exactly 0);
    the last row is invalid. Accuracy over valid rows of (logit > 0) == right: 2 of 4."""
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0, -3.0])
    one = torch.tensor([True, False, False, False, False])
    labels, argmax = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([1, 0, 0, 4, 5])
    valid = torch.tensor([True, True, True, True, False])
    used = torch.tensor([1.0, 0.5, 0.25, 1.0, 0.0])
    inputs = TermInputs(hidden=torch.randn(5, 3), labels=labels, prev=torch.tensor([7, 1, 2, 3, 4]), valid=valid,
                        lm_head=torch.randn(9, 3), chunk_size=4)
    chunk = ChunkOutputs(argmax=argmax, used=used, candidates=torch.empty(5, 0, dtype=torch.long))
    drafter = _dspark(logits)
    out = DSparkTerms().terms(drafter, inputs, chunk, {"confidence_weight": 2.0})
    right = (argmax == labels).float()
    want = (F.binary_cross_entropy_with_logits(logits, right, reduction="none") * used).sum() * 2.0
    torch.testing.assert_close(out.total, want)
    assert out.picks is None and set(out.logs) == {"confidence_bce", "confidence_accuracy"}
    assert out.logs["confidence_accuracy"].item() == pytest.approx(2 / 4)
    three = TermInputs(inputs.hidden, labels, inputs.prev, torch.tensor([True, True, False, False, True]),
                       inputs.lm_head, 4)  # rows 0, 1 right, row 4 wrong: 2 of 3
    assert DSparkTerms().terms(drafter, three, chunk, {"confidence_weight": 1.0}).logs[
        "confidence_accuracy"].item() == pytest.approx(2 / 3)
    single = TermInputs(inputs.hidden, labels, inputs.prev, one, inputs.lm_head, 4)
    assert DSparkTerms().terms(drafter, single, chunk, {"confidence_weight": 1.0}).logs[
        "confidence_accuracy"].item() == 1.0
    seen_hidden, seen_prev = drafter.module.confidence_head.seen
    assert seen_hidden is inputs.hidden and torch.equal(seen_prev, inputs.prev.float().unsqueeze(-1) * 10)
    assert DSparkTerms().terms(drafter, inputs, chunk, {"confidence_weight": 0}) is None
    no_head = SimpleNamespace(markov_head=drafter.module.markov_head)
    assert DSparkTerms().terms(no_head, inputs, chunk, {"confidence_weight": 1.0}) is None


def test_dflash2_reaches_the_selector_through_a_wrapper():
    selector = SimpleNamespace(top_k=5)
    assert DFlash2Terms().top_k(SimpleNamespace(module=SimpleNamespace(candidate_selector=selector))) == 5
    assert DFlash2Terms().top_k(SimpleNamespace(candidate_selector=selector)) == 5


def test_dflash2_selector_loss_and_picks_over_several_chunks_by_hand():
    """A selector whose score is the unary term alone: the loss is the weighted cross-entropy of the
    candidates' logits at the label's index (the label injected last where it missed the top-k), the pick
    each row's best candidate; six rows in chunks of four (more rows than hidden units)."""
    g = torch.Generator().manual_seed(0)
    hidden, lm_head = torch.randn(6, 2, generator=g), torch.randn(10, 2, generator=g)
    candidates = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 1, 2], [3, 4, 5], [6, 7, 8]])
    labels = torch.tensor([2, 9, 7, 0, 5, 1])  # row 1 and row 5: not among their candidates
    used = torch.tensor([1.0, 0.5, 1.0, 0.25, 1.0, 2.0])
    selector = SimpleNamespace(top_k=3, hidden_projection=lambda h: h,
                               scores=lambda projected, unary, cand, prev: unary)
    inputs = TermInputs(hidden, labels, torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.bool), lm_head, 4)
    chunk = ChunkOutputs(argmax=candidates[:, 0], used=used, candidates=candidates)
    out = DFlash2Terms().terms(SimpleNamespace(candidate_selector=selector), inputs, chunk,
                               {"selector_out_of_topk": "inject"})
    injected = candidates.clone()
    injected[[1, 5], -1] = labels[[1, 5]]
    unary = torch.einsum("nh,nkh->nk", hidden, lm_head[injected])
    target = (injected == labels[:, None]).long().argmax(-1)
    torch.testing.assert_close(out.total, (F.cross_entropy(unary, target, reduction="none") * used).sum())
    best = injected.gather(1, unary.argmax(-1, keepdim=True)).squeeze(1)
    assert out.picks.tolist() == [p if r not in (1, 5) else -1 for r, p in enumerate(best.tolist())]  # -1: label missed
    with pytest.raises(ValueError) as err:
        selector_ce(selector, hidden, lm_head, labels, labels, candidates, used, out_of_topk="drop")
    assert str(err.value) == "objective.kind.selector_out_of_topk must be one of ['inject', 'exclude'], got 'drop'"
