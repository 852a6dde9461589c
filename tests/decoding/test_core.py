"""The decoding core: acceptance and committing against brute-force loops, and the proposer
seam a path-choosing drafter (DFlash2) plugs into, through every engine."""

from __future__ import annotations

import random

import pytest
import torch
from test_sampling import chi2_excess
from testkit import random_prompts, tiny_drafter, tiny_qwen3

from dflash_train.decoding.core import (
    GREEDY,
    FromLogits,
    Proposal,
    Sampling,
    SpecLedger,
    accept,
    book_steps,
    compile_step,
    greedy_accept,
    leading_matches,
    speculative_accept,
    tally,
)
from dflash_train.decoding.proposers import DFlashProposer, as_proposer
from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.models.target import Target

VOCAB = 128


def test_leading_matches_equals_greedy_accept_and_a_loop():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 6)
        choice = [rng.randrange(3) for _ in range(n + 1)]
        drafts = [rng.randrange(3) for _ in range(n)]
        loop = 0
        while loop < n and drafts[loop] == choice[loop]:
            loop += 1
        assert leading_matches(drafts, choice) == loop
        logits = torch.nn.functional.one_hot(torch.tensor(choice), 3).float()
        assert greedy_accept(logits, torch.tensor(drafts, dtype=torch.long)) == (loop, choice[loop])
        assert accept(Proposal(torch.tensor(drafts, dtype=torch.long)), logits, GREEDY) == (loop, choice[loop])


def test_ledger_commits_like_a_token_by_token_loop():
    """Random verify steps: the ledger's tokens equal committing one token at a time with the
    stop/budget rule; acceptance and per-position counts are recorded as verified (before
    cutting), and tau counts the tokens each step kept: the token-by-token loop's own count."""
    rng = random.Random(1)
    for _ in range(100):
        budget, block, stop = rng.randint(0, 12), rng.randint(1, 5), {rng.randrange(6)}
        ledger = SpecLedger(budget, block, stop)
        expected, finished, steps, kept = [], budget <= 0, [], []
        if not finished:
            first = rng.randrange(6)
            ledger.start(first)
            expected, finished = [first], first in stop or budget <= 1
        while not ledger.finished:
            drafts = [rng.randrange(6) for _ in range(block - 1)]
            accepted = rng.randint(0, block - 1)
            nxt = rng.randrange(6)
            steps.append(accepted + 1)
            ledger.commit(drafts, accepted, nxt)
            kept.append(0)
            for tok in drafts[:accepted] + [nxt]:
                if finished:
                    break
                expected.append(tok)
                kept[-1] += 1
                finished = tok in stop or len(expected) >= budget
        assert finished
        result = ledger.done()
        assert result.tokens == expected and result.acceptance_lengths == steps
        assert result.kept_lengths == kept and sum(kept) == max(0, len(expected) - 1)
        assert result.mean_tau == (sum(kept) / len(kept) if kept else 0.0)
        for k in range(1, block):
            assert result.position_reached[k - 1] == sum(t >= k for t in steps)
            assert result.position_accepted[k - 1] == sum(t >= k + 1 for t in steps)


def test_an_engines_steps_booked_by_the_ledger_count_as_our_own():
    """The one accounting: an engine's per-step acceptance booked through the ledger gives the
    kept lengths, tau and per-position counts our own decode of those steps gives; uncut
    (``new_tokens`` None) it books every step, as verified."""
    rng = random.Random(2)
    for _ in range(50):
        block = rng.randint(2, 5)
        accepted = [rng.randint(0, block - 1) for _ in range(rng.randint(0, 6))]
        budget = rng.randint(0, sum(accepted) + len(accepted) + 1)
        ledger = SpecLedger(budget, block)
        if not ledger.finished:
            ledger.start(0)
        for a in accepted:
            if ledger.finished:
                break
            ledger.commit([0] * a, a, 0)
        ours = ledger.done()
        booked = book_steps(accepted, budget, block)
        assert (booked.kept_lengths, booked.acceptance_lengths) == (ours.kept_lengths, ours.acceptance_lengths)
        assert (booked.position_reached, booked.position_accepted) == (ours.position_reached, ours.position_accepted)
        assert tally([booked]).tau() == ours.mean_tau
        uncut = book_steps(accepted, None, block)
        assert uncut.acceptance_lengths == [a + 1 for a in accepted] == uncut.kept_lengths


def test_tally_pools_steps_and_prompts_and_says_what_an_empty_count_is():
    a, b, ended = book_steps([2, 0], None, 4), book_steps([3], 3, 4), book_steps([], 1, 4)
    counted = tally([a, b, ended])
    assert (counted.kept, counted.steps) == ([4, 2, 0], [2, 1, 0])
    assert counted.tau() == 2.0 and counted.prompt_taus() == [2.0, 2.0, 0.0] and counted.per_prompt_tau() == 2.0
    assert counted.verified_tau() == 8 / 3 and counted.histogram(4) == {"1": 1, "2": 0, "3": 1, "4": 1}
    assert counted.position_reached == [3, 2, 2] and counted.position_accepted == [2, 2, 1]
    assert counted.position_rates() == [2 / 3, 1.0, 0.5] and counted.position_shares() == [2 / 3, 2 / 3, 1 / 3]
    assert tally([ended]).tau() == 0.0 and tally([ended]).tau(float("inf")) == float("inf")


def test_accept_needs_q_when_sampling():
    with pytest.raises(ValueError, match="q"):
        accept(Proposal(torch.tensor([1])), torch.zeros(2, 4), Sampling(temperature=1.0))


def test_rejection_rule_is_lossless_for_a_q_on_few_candidates():
    """A path drafter samples among top-k candidates: its q is zero elsewhere. The committed
    token is still distributed as the target's p (chi-square at 1e-4)."""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.0, 0.0, 0.7, 0.3]])  # two candidates
    gen = torch.Generator().manual_seed(0)
    first = torch.empty(20000, dtype=torch.long)
    for i in range(len(first)):
        draft = torch.multinomial(q, 1, generator=gen).view(-1)
        accepted, nxt = speculative_accept(p, q, draft, gen)
        first[i] = draft[0] if accepted else nxt
    assert chi2_excess(torch.bincount(first, minlength=4).float(), p[0]) < 0


# ---------------------------------------------------------------------------------------
# the chooser seam: a drafter whose block is a walk over candidates
# ---------------------------------------------------------------------------------------
class WalkChooser:
    """A DFlash2-like path: each slot takes one of its top-2 candidates, which one decided by
    the token chosen before it (the anchor for slot 1), so slot k depends on slot k-1. Pure
    tensor code (the static engine calls it inside its draft step). Records its calls."""

    def __init__(self):
        self.calls, self.argmax = [], []

    def __call__(self, hidden, logits, anchor, sampling):
        assert hidden.shape[0] == logits.shape[0] and anchor.shape == (1,)
        candidates = logits.topk(2, dim=-1).indices
        prev, path = anchor.view(1), []
        for slot in range(candidates.shape[0]):
            prev = candidates[slot].gather(0, prev % 2)
            path.append(prev)
        tokens = torch.cat(path) if path else torch.zeros(0, dtype=torch.long, device=logits.device)
        self.calls.append(tokens.tolist())
        self.argmax.append(logits.argmax(-1).tolist())
        return Proposal(tokens)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_qwen3(vocab=VOCAB))


def test_a_drafter_with_its_own_chooser_drafts_its_path_in_every_engine(target):
    """The reference loop and the static engine both draft with the drafter's chooser (the
    same path at every step), stay lossless, and the path is not the argmax drafts."""
    drafter, _ = tiny_drafter(target, block_size=6, seed=3)
    drafter.block_chooser = WalkChooser()
    decoder = StaticDecoder(target, drafter, max_len=96, mode="eager")
    for ids in random_prompts(3, seed=11, vocab=VOCAB):
        drafter.block_chooser.calls.clear()
        ref = speculative_generate(target, drafter, ids, 30)
        ref_calls, argmax = list(drafter.block_chooser.calls), drafter.block_chooser.argmax
        drafter.block_chooser.calls.clear()
        out = decoder.speculative(ids, 30)
        assert ref.tokens == out.tokens == target_generate(target, ids, 30).tokens  # lossless
        assert out.acceptance_lengths == ref.acceptance_lengths
        assert drafter.block_chooser.calls == ref_calls and len(ref_calls) == ref.num_steps
        assert any(path != best for path, best in zip(ref_calls, argmax))  # not the argmax drafts


def test_replay_walks_use_the_drafters_chooser(target):
    """Replay step by step and replay with all blocks in one forward draft the chooser's path."""
    from dflash_train.eval.replay import replay_one, replay_one_batched

    drafter, _ = tiny_drafter(target, block_size=4, seed=6)
    drafter.block_chooser = WalkChooser()
    ids = random_prompts(1, seed=2, vocab=VOCAB)[0]
    cont = target_generate(target, ids, 20 + 4).tokens
    stepwise = replay_one(target, drafter, ids, cont, 20, 3, set())
    batched = replay_one_batched(target, drafter, ids, cont, 20, 3, set())
    assert stepwise.acceptance_lengths == batched.acceptance_lengths
    assert stepwise.acceptance_lengths == speculative_generate(target, drafter, ids, 20).acceptance_lengths


def test_as_proposer_wraps_logit_proposers_and_refuses_others(target):
    drafter, _ = tiny_drafter(target, block_size=4)
    assert isinstance(as_proposer(target, drafter), DFlashProposer)

    class Logits:
        feature_layer_ids, block_size = [], 3

        def reset(self):
            pass

        def propose(self, tokens, new_features, num_draft):
            return torch.eye(VOCAB)[:num_draft] * 5

    wrapped = as_proposer(target, Logits())
    assert isinstance(wrapped, FromLogits)
    assert wrapped.propose_block([1, 2], None, 2, GREEDY).tokens.tolist() == [0, 1]
    with pytest.raises(TypeError, match="not a drafter"):
        as_proposer(target, object())


def test_compile_step_raises_the_recompile_limit_once_for_both_engines():
    import torch._dynamo as dynamo

    name = "recompile_limit" if hasattr(dynamo.config, "recompile_limit") else "cache_size_limit"
    before = getattr(dynamo.config, name)
    try:
        fn = compile_step(lambda x: x + 1, "default", recompile_limit=before + 3)
        assert getattr(dynamo.config, name) == before + 3
        compile_step(lambda x: x, "default", recompile_limit=1)
        assert getattr(dynamo.config, name) == before + 3  # never lowered
        assert callable(fn)
    finally:
        setattr(dynamo.config, name, before)
