"""``decoding/core.py`` pinned where mutation testing found it unchecked (issue 60, item 4).

``scripts/mutation.sh core`` left 167 mutants alive against the core's own tests (and 11 with no
test at all): the sampling path outside the slow end-to-end cases (temperature, nucleus edges,
the generator threading that makes a seeded decode reproducible, empty blocks, the residual's
fallback), the plain loop's positions, budget edges and top-k record, both loops' timings,
``book_steps``'s default block size, :class:`Tally`'s empty counts and histogram, and the chooser
registry. Each test here checks numbers against a simple reference: a brute-force loop, plain
greedy over a fixed table, ``torch.multinomial`` on the same seed, or values worked by hand.
The survivors judged equivalent (devices on CPU-only code, a message text, speed-only compile
options) are listed in ``docs/results/mutation/core-triage.md``. CPU, tiny tensors, no compile.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from test_sampling import chi2_excess

from dflash_train.decoding.core import (
    NO_CLOCK,
    HostClock,
    NoClock,
    Proposal,
    Sampling,
    SpecLedger,
    SpecResult,
    Tally,
    accept,
    block_chooser,
    book_steps,
    choose_independently,
    choose_next,
    compile_step,
    next_token,
    plain_loop,
    proposal_from_logits,
    sample,
    sample_without_sync,
    speculative_accept,
    speculative_loop,
    tally,
    truncate,
    warp,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------
# warping and sampling
# ---------------------------------------------------------------------------------------
def test_warp_divides_by_the_temperature():
    logits = torch.tensor([1.0, 2.0, 4.0])
    for t in (0.5, 2.0):
        expected = torch.softmax(logits.double() / t, -1).float()
        torch.testing.assert_close(warp(logits, t), expected)
        torch.testing.assert_close(Sampling(temperature=t).probs(logits), expected)
    torch.testing.assert_close(Sampling(temperature=1.0, top_p=0.7).probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))),
                               torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


def test_top_p_one_filters_nothing_not_even_a_tail_below_float_resolution():
    """``top_p`` 1.0 is "no nucleus": a tail token whose mass is lost in the cumulative sum's
    rounding keeps its (tiny) probability."""
    logits = torch.tensor([0.0, -20.0, -20.0])
    probs = warp(logits, 1.0, top_p=1.0)
    torch.testing.assert_close(probs, torch.softmax(logits, -1), rtol=0, atol=0)
    assert probs[1] > 0


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_it():
    """Four equal tokens, ``top_p`` 0.5: two of them (mass 0.5) reach it; a third is not kept
    although the mass before it equals ``top_p``."""
    probs = warp(torch.zeros(4), 1.0, top_p=0.5)
    assert sorted(probs.tolist()) == [0.0, 0.0, 0.5, 0.5]


def test_top_p_normalises_each_row_of_a_block_on_its_own():
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 0.5, 2.0, 2.5]])
    both = warp(logits, 0.8, top_p=0.9)
    for row in range(2):
        torch.testing.assert_close(both[row], warp(logits[row], 0.8, top_p=0.9))
    torch.testing.assert_close(both.sum(-1), torch.ones(2))


def test_sample_draws_on_the_given_generator_one_index_per_row():
    probs = torch.softmax(torch.randn(64, 8, generator=gen(1)), -1)
    torch.manual_seed(123)  # the global RNG differs from the seeded one
    drawn = sample(probs, gen(5))
    assert drawn.shape == (64,)
    assert drawn.tolist() == torch.multinomial(probs, 1, generator=gen(5)).view(-1).tolist()
    unseeded = sample(probs, None)
    assert unseeded.shape == (64,) and bool((probs[torch.arange(64), unseeded] > 0).all())


def test_sample_without_sync_is_distributed_as_the_probabilities():
    """The exponential race picks row i's token with probability ``probs[i]`` (chi-square at
    1e-4 over 30000 rows of one distribution); each row is its own race."""
    torch.manual_seed(0)
    p = torch.tensor([0.6, 0.3, 0.1])
    drawn = sample_without_sync(p.expand(30000, 3).contiguous())
    assert drawn.shape == (30000,)
    assert chi2_excess(torch.bincount(drawn, minlength=3).float(), p) < 0
    rows = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert sample_without_sync(rows).tolist() == [2, 0, 1]


def test_choose_next_samples_the_warped_distribution_on_the_samplings_generator():
    logits = torch.tensor([0.3, 1.0, -0.5, 0.8, 0.0, 0.2])
    sampling = Sampling(temperature=0.7, top_p=0.9, generator=gen(3))
    reference = gen(3)
    for i in range(40):
        torch.manual_seed(1000 + i)
        expected = int(torch.multinomial(warp(logits, 0.7, 0.9)[None], 1, generator=reference))
        assert next_token(logits, sampling) == expected
    assert int(choose_next(logits, Sampling())) == 1  # greedy: the argmax


def test_a_sampled_proposal_is_a_draw_of_the_warped_logits_and_carries_them_as_q():
    logits = torch.randn(4, 6, generator=gen(2))
    sampling, reference = Sampling(temperature=0.9, generator=gen(7)), gen(7)
    for i in range(10):
        torch.manual_seed(i)
        proposal = proposal_from_logits(logits, sampling)
        q = warp(logits, 0.9)
        torch.testing.assert_close(proposal.q, q)
        assert proposal.tokens.tolist() == torch.multinomial(q, 1, generator=reference).view(-1).tolist()
    greedy = choose_independently(None, logits, torch.tensor([0]), Sampling())
    assert greedy.tokens.tolist() == logits.argmax(-1).tolist() and greedy.q is None


# ---------------------------------------------------------------------------------------
# the rejection rule
# ---------------------------------------------------------------------------------------
def reference_accept(p, q, drafts, generator):
    """Speculative sampling written out draft by draft, drawing from ``generator`` in the order
    the rule does (the block's uniforms, then the one resample)."""
    n = len(drafts)
    u = torch.rand(n, generator=generator)
    accepted = 0
    while accepted < n and u[accepted] * q[accepted, drafts[accepted]] < p[accepted, drafts[accepted]]:
        accepted += 1
    if accepted < n:
        residual = torch.clamp(p[accepted] - q[accepted], min=0)
        dist = residual / residual.sum() if residual.sum() > 0 else p[accepted]
    else:
        dist = p[n]
    return accepted, int(torch.multinomial(dist[None], 1, generator=generator))


def test_speculative_accept_equals_the_rule_draft_by_draft_on_the_same_generator():
    rng = random.Random(0)
    ours, theirs = gen(11), gen(11)
    lengths = set()
    for trial in range(200):
        n, v = rng.randint(0, 4), 5
        p = torch.softmax(torch.randn(n + 1, v, generator=gen(trial)), -1)
        q = torch.softmax(torch.randn(n, v, generator=gen(10_000 + trial)), -1)
        drafts = torch.tensor([rng.randrange(v) for _ in range(n)], dtype=torch.long)
        torch.manual_seed(trial)  # the global RNG moves: only the given generator may be read
        got = speculative_accept(p, q, drafts, ours)
        assert got == reference_accept(p, q, drafts.tolist(), theirs)
        lengths.add(got[0])
    assert lengths == {0, 1, 2, 3, 4}


def test_accept_when_sampling_is_the_rule_on_the_warped_target_logits():
    logits = torch.randn(4, 6, generator=gen(4))
    proposal = proposal_from_logits(torch.randn(3, 6, generator=gen(5)), Sampling(temperature=1.3, generator=gen(6)))
    sampling, reference = Sampling(temperature=1.3, top_p=0.95, generator=gen(8)), gen(8)
    p = warp(logits, 1.3, 0.95)
    for i in range(50):
        torch.manual_seed(i)
        assert accept(proposal, logits, sampling) == reference_accept(p, proposal.q, proposal.tokens.tolist(), reference)


def test_an_empty_block_accepts_nothing_and_samples_the_first_row():
    p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert speculative_accept(p, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), gen(0)) == (0, 2)
    assert speculative_accept(p, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), None) == (0, 2)


def test_a_token_the_target_gives_no_mass_is_never_accepted_and_an_empty_residual_falls_back_to_p():
    """A draft with p = 0 is rejected even when q (wrongly) says 0 too; the residual
    ``max(p - q, 0)`` is then empty and the next token comes from ``p``."""
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    for seed in range(20):
        assert speculative_accept(p, q, torch.tensor([0]), gen(seed)) == (0, 1)
    assert speculative_accept(p, q, torch.tensor([0]), None) == (0, 1)


# ---------------------------------------------------------------------------------------
# the chooser registry
# ---------------------------------------------------------------------------------------
def test_block_chooser_finds_the_kinds_chooser_by_name(monkeypatch):
    from dflash_train.decoding.choosers import CHOOSERS

    made = []

    def factory(drafter):
        made.append(drafter)
        return "the kind's chooser"

    monkeypatch.setitem(CHOOSERS, "mutant-kind", factory)
    drafter = SimpleNamespace(kind=SimpleNamespace(name="mutant-kind"))
    assert block_chooser(drafter) == "the kind's chooser" and made == [drafter]
    assert block_chooser(SimpleNamespace()) is choose_independently  # no kind: DFlash's
    assert block_chooser(SimpleNamespace(kind=SimpleNamespace(name="unknown"))) is choose_independently
    own = SimpleNamespace(kind=SimpleNamespace(name="mutant-kind"), block_chooser="its own")
    assert block_chooser(own) == "its own"


# ---------------------------------------------------------------------------------------
# committing: truncate, the ledger's budget edges, SpecResult
# ---------------------------------------------------------------------------------------
def test_truncate_cuts_at_the_first_stop_or_the_budget():
    assert truncate([1, 2, 3], 2, set()) == ([1, 2], True)
    assert truncate([1, 2], 2, set()) == ([1, 2], True)
    assert truncate([1, 2], 3, set()) == ([1, 2], False)
    assert truncate([1, 5, 2], 3, {5}) == ([1, 5], True)
    assert truncate([1, 2], 0, {1}) == ([], True)


class FixedSteps:
    """A speculative engine over a fixed target continuation ``target``: each block drafts
    ``target`` with every third draft wrong; acceptance is plain greedy (the leading drafts that
    equal the continuation, then the continuation's next token)."""

    def __init__(self, target: list[int], block_size: int):
        self.target, self.num_draft, self.calls = target, block_size - 1, []

    def prefill(self, input_ids):
        self.calls.append("prefill")
        return self.target[0]

    def draft(self, generated):
        at = len(generated)
        return at, [t + (1 if (at + k) % 3 == 2 else 0) for k, t in enumerate(self.target[at:at + self.num_draft])]

    def verify(self, block):
        return block

    def accept(self, pending):
        at, drafts = pending
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == self.target[at + accepted]:
            accepted += 1
        return drafts, accepted, self.target[at + accepted]

    def keep(self, accepted):
        self.calls.append(("keep", accepted))


class SquareClock:
    """Reading i (from 1) is i*i, so every difference of two readings is distinct."""

    def __init__(self):
        self.i = 0

    def read(self):
        self.i += 1
        return float(self.i * self.i)

    wall = now = mark = read

    def seconds(self, start, end):
        return end - start


def test_a_zero_or_one_token_budget_stops_before_or_at_the_prefill():
    assert SpecLedger(0, 4).finished is True and SpecLedger(1, 4).finished is False
    steps = FixedSteps(list(range(10, 40)), 4)
    none = speculative_loop(steps, None, 0, 4)
    assert none.tokens == [] and steps.calls == []
    one = speculative_loop(steps, None, 1, 4)
    assert one.tokens == [10] and one.num_steps == 0 and one.kept_lengths == [] and one.mean_tau == 0.0
    assert steps.calls == ["prefill"]


def test_speculative_loop_equals_plain_greedy_and_times_each_part():
    target = list(range(10, 40))
    steps = FixedSteps(target, 4)
    result = speculative_loop(steps, None, 9, 4, clock=SquareClock())
    assert result.tokens == target[:9] and result.block_size == 4
    assert sum(result.kept_lengths) == 8 and result.mean_tau == 8 / result.num_steps
    # readings 1, 4: the prefill; per step now, mark, mark; then the last wall
    n = result.num_steps
    reads = [float(i * i) for i in range(1, 3 * n + 4)]
    assert result.prefill_time == reads[1] - reads[0]
    assert result.draft_time == sum(reads[2 + 3 * s + 1] - reads[2 + 3 * s] for s in range(n))
    assert result.verify_time == sum(reads[2 + 3 * s + 2] - reads[2 + 3 * s + 1] for s in range(n))
    assert result.decode_time == reads[-1] - reads[1]
    untimed = speculative_loop(FixedSteps(target, 4), None, 9, 4)
    assert (untimed.prefill_time, untimed.decode_time, untimed.draft_time, untimed.verify_time) == (0.0,) * 4


def test_clocks_measure_end_minus_start_and_no_clock_reads_zero():
    assert HostClock("cpu").seconds(2.0, 5.5) == 3.5
    clock = HostClock("cpu")
    a = clock.now()
    assert clock.mark() >= a and clock.wall() >= a
    assert (NO_CLOCK.wall(), NO_CLOCK.now(), NO_CLOCK.mark(), NoClock().seconds(1.0, 5.0)) == (0.0,) * 4


def test_an_empty_result_has_no_tokens_and_its_block_size():
    empty = SpecResult.empty(4)
    assert (empty.tokens, empty.acceptance_lengths, empty.block_size) == ([], [], 4)
    assert empty.position_reached == empty.position_accepted == [0, 0, 0]


# ---------------------------------------------------------------------------------------
# the plain loop
# ---------------------------------------------------------------------------------------
V = 7


def table_logits(position: int) -> torch.Tensor:
    return torch.randn(V, generator=gen(position))


class TableSteps:
    """A target whose logits at a position are fixed (seeded by the position): plain greedy is
    the argmax at prompt_len - 1, prompt_len, ... Records the positions it is asked for and
    refuses to run past ``limit`` steps (a loop that ignores the budget fails, not hangs)."""

    def __init__(self, limit: int):
        self.positions, self.limit = [], limit

    def prefill(self, input_ids):
        self.positions.append(("prefill", int(input_ids.shape[-1])))
        logits = table_logits(int(input_ids.shape[-1]) - 1)
        return logits, logits.argmax()

    def step(self, token, position):
        assert len(self.positions) <= self.limit, "stepped past the budget"
        self.positions.append(position)
        logits = table_logits(position)
        return logits, int(logits.argmax())


def test_plain_loop_is_plain_greedy_at_the_right_positions_with_its_top_k():
    ids = torch.zeros(1, 5, dtype=torch.long)
    steps = TableSteps(limit=4)
    result = plain_loop(steps, ids, 4, record_topk=2, clock=SquareClock())
    assert result.tokens == [int(table_logits(p).argmax()) for p in range(4, 8)]
    assert steps.positions == [("prefill", 5), 5, 6, 7]
    expected = torch.stack([table_logits(p).topk(2).values for p in range(4, 8)])
    torch.testing.assert_close(result.topk_values, expected)
    assert result.topk_ids.tolist() == [table_logits(p).topk(2).indices.tolist() for p in range(4, 8)]
    assert (result.prefill_time, result.decode_time) == (4.0 - 1.0, 9.0 - 4.0)


def test_plain_loop_budget_edges_stop_token_and_no_top_k_by_default():
    ids = torch.zeros(1, 3, dtype=torch.long)
    steps = TableSteps(limit=0)
    assert plain_loop(steps, ids, 0).tokens == [] and steps.positions == []
    one = plain_loop(TableSteps(limit=1), ids, 1)
    assert one.tokens == [int(table_logits(2).argmax())] and one.topk_values is None and one.topk_ids is None
    greedy = [int(table_logits(p).argmax()) for p in range(2, 12)]
    stop = greedy[3]
    first = greedy.index(stop)
    stopped = plain_loop(TableSteps(limit=10), ids, 10, stop_token_ids=[stop])
    assert stopped.tokens == greedy[:first + 1]
    assert (stopped.prefill_time, stopped.decode_time) == (0.0, 0.0)


# ---------------------------------------------------------------------------------------
# booking another engine's steps, and the tally
# ---------------------------------------------------------------------------------------
def test_book_steps_default_block_has_a_position_past_the_longest_acceptance():
    """Default block size = largest accepted + 2: a step that accepted every draft it had reached
    one more position, which it did not accept (counts worked by hand)."""
    booked = book_steps([2, 0, 1], None)
    assert booked.block_size == 4
    assert booked.position_reached == [3, 2, 1] and booked.position_accepted == [2, 1, 0]
    assert booked.kept_lengths == [3, 1, 2] and booked.tokens == [-1] * 7
    ended = book_steps([], None)
    assert ended.block_size == 2 and ended.position_reached == [0] and ended.tokens == [-1]


def test_tally_pads_and_trims_positions_and_counts_no_result():
    a, b = book_steps([2, 0], None, 3), book_steps([1], None, 3)  # two positions each
    assert tally([a, b]).position_reached == [3, 2]
    padded = tally([a, b], num_draft=4)
    assert padded.position_reached == [3, 2, 0, 0] and padded.position_accepted == [2, 1, 0, 0]
    assert tally([a, b], num_draft=1).position_accepted == [2]
    none = tally([])
    assert (none.kept, none.steps, none.verified, none.position_reached, none.position_accepted) == ([], [], [], [], [])
    assert none.tau() == 0.0


def test_an_empty_tally_reads_zero_unless_told_otherwise():
    ended = tally([book_steps([], 1, 4)])  # a prompt that ended at the prefill
    assert ended.tau() == ended.per_prompt_tau() == ended.verified_tau() == 0.0
    assert ended.position_shares() == [0.0, 0.0, 0.0] and ended.position_rates() == [None, None, None]
    assert ended.per_prompt_tau(-1.0) == ended.verified_tau(-1.0) == -1.0 and ended.position_shares(-1.0) == [-1.0] * 3
    assert book_steps([], 1, 4).verified_tau == 0.0


def test_histogram_counts_repeats_and_lengths_past_the_block():
    counted = Tally(verified=[1, 1, 3, 6, 6, 6])
    assert counted.histogram(4) == {"1": 2, "2": 0, "3": 1, "4": 0, "6": 3}
    assert Tally(verified=[2]).histogram(2) == {"1": 0, "2": 1}


def test_position_rates_leave_an_unreached_position_none():
    assert Tally(position_reached=[4, 2, 0], position_accepted=[2, 0, 0]).position_rates() == [0.5, 0.0, None]


# ---------------------------------------------------------------------------------------
# compile settings
# ---------------------------------------------------------------------------------------
def test_compile_step_compiles_the_function_with_static_shapes_and_the_mode(monkeypatch):
    """What ``compile_step`` hands ``torch.compile`` (recorded, not compiled), and the default
    recompile limit it sets."""
    import torch._dynamo as dynamo

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: calls.append((fn, kw)) or fn)
    name = "recompile_limit" if hasattr(dynamo.config, "recompile_limit") else "cache_size_limit"
    before = getattr(dynamo.config, name)

    def fn(x):
        return x + 1

    try:
        setattr(dynamo.config, name, 2)
        assert compile_step(fn) is fn and getattr(dynamo.config, name) == 16
        compile_step(fn, "default")
        compile_step(fn, "reduce-overhead")
    finally:
        setattr(dynamo.config, name, before)
    assert calls == [(fn, {"dynamic": False, "mode": None}), (fn, {"dynamic": False, "mode": None}),
                     (fn, {"dynamic": False, "mode": "reduce-overhead"})]


@pytest.mark.parametrize("greedy", [True, False])
def test_accept_reads_greedy_or_sampling_from_the_sampling(greedy):
    """A one-hot target: greedy and sampling agree on (accepted, next) whatever the generator."""
    logits = torch.full((3, 4), -1e4)
    logits[0, 1] = logits[1, 3] = logits[2, 0] = 0.0
    q = torch.full((2, 4), 0.25)
    sampling = Sampling() if greedy else Sampling(temperature=1.0, generator=gen(0))
    assert accept(Proposal(torch.tensor([1, 2]), q), logits, sampling) == (1, 3)
