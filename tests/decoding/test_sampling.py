"""Speculative sampling keeps the target's distribution (statistical tests, fixed seeds)."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.decoding.speculative import speculative_accept, speculative_generate, warp
from dflash_train.models.target import Target

# chi-square critical values at significance 1e-4 by degrees of freedom
CHI2_CRIT = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88}


def chi2_excess(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square over the critical value at 1e-4 (> 0 means "reject"); categories
    expected fewer than 5 times are pooled into one bin."""
    expected = probs.double() * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts.double()[big], counts.double()[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    if exp[-1] < 5:  # merge the leftover bin into the smallest big one
        obs, exp = obs[:-1].clone(), exp[:-1].clone()
        j = int(exp.argmin())
        obs[j] += counts.double()[~big].sum()
        exp[j] += expected[~big].sum()
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat - CHI2_CRIT[len(exp) - 1]


P = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.1, 0.2, 0.6], [0.25, 0.25, 0.25, 0.25]])
Q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]])


def draw(rule, n=20000, seed=0):
    """Committed tokens of a 2-draft block: first[i] always, second[i] when the first draft
    was accepted (-1 otherwise)."""
    gen = torch.Generator().manual_seed(seed)
    first, second = torch.empty(n, dtype=torch.long), torch.full((n,), -1)
    for i in range(n):
        drafts = torch.multinomial(Q, 1, generator=gen).view(-1)
        accepted, nxt = rule(P, Q, drafts, gen)
        committed = drafts[:accepted].tolist() + [nxt]
        first[i] = committed[0]
        if len(committed) > 1:
            second[i] = committed[1]
    return first, second


def test_accept_rule_preserves_target_distribution():
    first, second = draw(speculative_accept)
    # first committed token ~ p_0; given d_1 accepted, the second ~ p_1
    assert chi2_excess(torch.bincount(first, minlength=4).float(), P[0]) < 0
    cond = second[second >= 0]
    assert len(cond) > 3000
    assert chi2_excess(torch.bincount(cond, minlength=4).float(), P[1]) < 0
    # acceptance rate of d_1 is sum(min(p, q))
    assert abs(len(cond) / len(second) - float(torch.minimum(P[0], Q[0]).sum())) < 0.02


def test_accept_rule_test_has_power():
    """Plausible wrong rules (resample from p instead of the residual; always accept)
    fail the same statistic."""

    def resample_from_p(p, q, drafts, gen):
        accepted, _ = speculative_accept(p, q, drafts, gen)
        return accepted, int(torch.multinomial(p[accepted], 1, generator=gen))

    def always_accept(p, q, drafts, gen):
        return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=gen))

    for rule in (resample_from_p, always_accept):
        first, _ = draw(rule, n=5000)
        assert chi2_excess(torch.bincount(first, minlength=4).float(), P[0]) > 0


def test_residual_when_q_dominates_everywhere():
    """p == q: everything is accepted and the bonus comes from the row after."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.2, 0.8], [1.0, 0.0]])
    for _ in range(50):
        d = torch.multinomial(p[:1], 1, generator=gen).view(-1)
        assert speculative_accept(p, p[:1], d, gen) == (1, 0)


def test_top_p_warp():
    probs = warp(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, top_p=0.7)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)
    torch.testing.assert_close(warp(torch.tensor([0.0, 0.0]), 0.5), torch.tensor([0.5, 0.5]))


class SampledPath:
    """A DFlash2-like sampled path: each slot draws among its top-2 candidates from a softmax
    of scores that depend on the token drawn before it (the anchor for slot 1); ``q`` is that
    distribution over the candidates, zero elsewhere. Counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, hidden, logits, anchor, sampling):
        from dflash_train.decoding.core import Proposal, sample

        self.calls += 1
        top = logits.topk(2, dim=-1)
        prev, tokens, q = anchor.view(1), [], torch.zeros_like(logits)
        for slot in range(logits.shape[0]):
            scores = top.values[slot] + 1.5 * (top.indices[slot] % 2 == prev % 2).float()
            probs = torch.softmax(scores / sampling.temperature, -1)
            q[slot, top.indices[slot]] = probs
            prev = top.indices[slot][sample(probs[None], sampling.generator)]
            tokens.append(prev)
        return Proposal(torch.cat(tokens), q)


@pytest.mark.parametrize("chooser", [None, SampledPath, "dspark"], ids=["dflash", "sampled-path", "dspark"])
def test_end_to_end_sampling_matches_target(chooser):
    """Tokens 2 and 3 of a sampled speculative decode (the first ones that go through
    draft + verify) follow the target's exact marginals, computed by enumeration; also with a
    drafter whose proposal is a sampled path over few candidates (its q is zero elsewhere)."""
    vocab = 8
    model = tiny_qwen3(num_layers=4, hidden=32, vocab=vocab, seed=3)
    with torch.no_grad():  # sharpen the distributions so target and drafter disagree clearly
        model.lm_head.weight.mul_(12.0)
    target = Target(model)
    if chooser == "dspark":  # the Markov chain's own chooser, its bias far from zero
        drafter, _ = tiny_drafter(target, num_layers=1, block_size=4, seed=4, kind="dspark",
                                  options={"markov_rank": 4})
        with torch.no_grad():
            drafter.markov_head.markov_w2.weight.normal_(std=3.0)
    else:
        drafter, _ = tiny_drafter(target, num_layers=1, block_size=4, seed=4)
        if chooser is not None:
            drafter.block_chooser = chooser()
    prompt = torch.tensor([[1, 5, 2]])

    with torch.no_grad():
        p1 = torch.softmax(model(prompt).logits[0, -1].float(), -1)
        two = torch.cat([prompt.repeat(vocab, 1), torch.arange(vocab)[:, None]], 1)
        p2 = torch.softmax(model(two).logits[:, -1].float(), -1)  # [t1, t2]
        three = torch.cat([two.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(vocab)[:, None]], 1)
        p3 = torch.softmax(model(three).logits[:, -1].float(), -1).view(vocab, vocab, vocab)
    joint12 = p1[:, None] * p2
    marg2 = joint12.sum(0)
    marg3 = (joint12[:, :, None] * p3).sum((0, 1))
    assert float(marg2.max()) < 0.9 and float(marg3.max()) < 0.9  # non-trivial distributions

    n = 800
    counts2, counts3, taus = torch.zeros(vocab), torch.zeros(vocab), []
    gen = torch.Generator().manual_seed(0)
    for _ in range(n):
        out = speculative_generate(target, drafter, prompt, 3, temperature=1.0, generator=gen)
        counts2[out.tokens[1]] += 1
        counts3[out.tokens[2]] += 1
        taus.append(out.acceptance_lengths[0])
    assert chi2_excess(counts2, marg2) < 0
    assert chi2_excess(counts3, marg3) < 0
    assert len(set(taus)) > 1  # both the accept and the reject paths were taken
    assert chooser in (None, "dspark") or drafter.block_chooser.calls >= n  # the path drafter drafted
