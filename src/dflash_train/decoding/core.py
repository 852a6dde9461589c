"""The decoding core every engine shares: proposals, acceptance, committing, results.

A speculative decode is one loop, :func:`speculative_loop`, for every engine (the Hugging Face
reference loop, the static CUDA-graph engine, the replay walk); each engine gives only its steps
(:class:`SpecSteps`: prefill, draft, verify a block, read the acceptance, keep the verified
prefix), and plain decoding likewise (:func:`plain_loop` over :class:`PlainSteps`):

1. **draft**: a proposer turns the context and the verified anchor (the last committed
   token) into a :class:`Proposal`: the block's draft tokens and, when sampling, the
   distribution ``q`` each was drawn from;
2. **verify**: the target scores ``[anchor, drafts]`` in one forward (each engine runs
   that forward its own way: an HF cache, a captured CUDA graph, or a stored greedy
   continuation);
3. **accept**: greedy keeps the longest prefix of drafts equal to the target's argmax
   (:func:`leading_matches`, :func:`greedy_accept`) and adds the target's next choice;
   sampling keeps each draft with probability ``min(1, p/q)`` and resamples from the
   residual at the first rejection (:func:`speculative_accept`);
4. **commit**: :class:`SpecLedger` cuts the new tokens at a stop token or the token budget,
   records the step (its acceptance as verified, the tokens it kept, the per-position
   counts), and says when to stop.

**Tau** is the tokens committed per target verify step: :attr:`SpecResult.mean_tau` =
kept tokens / verify steps. One accounting counts it for every engine: another engine's
per-step acceptance (llama.cpp's, vLLM's) is booked by the same ledger (:func:`book_steps`),
and :func:`tally` counts tau, the acceptance as verified and the per-position acceptance from
ledger steps, whoever decoded them (``eval``, replay, the llama.cpp and vLLM reports). The prefill's token is not a step's, and a step cut by a stop
token or the budget counts only what it kept (drafts the target accepted past the cut were
never emitted). ``acceptance_lengths`` keeps each step's acceptance as verified (accepted
drafts + 1, before any cut) for histograms and per-position rates, and for comparison with
decoders that count it.

What a drafter must provide is :class:`BlockProposer` (``propose_block``). A DFlash
drafter's proposal is "the block's logits, then argmax (or a sample)"; how a block's
tokens are chosen from the drafter's output is a separate seam, :class:`BlockChooser`,
so a drafter kind whose proposal is a path (DFlash2: a walk over each slot's top-k candidates
scored by a selector)
plugs in by registering its chooser (``decoding/choosers/``, :func:`block_chooser`), in the
reference loop and in the static engine alike.

Also here: the compile settings both static engines use (:func:`compile_step`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


# ---------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sampling:
    """How tokens are picked: ``temperature`` 0 is greedy; > 0 samples from the warped
    distribution (:func:`warp`, optionally nucleus-filtered by ``top_p``) with ``generator``."""

    temperature: float = 0.0
    top_p: float | None = None
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return warp(logits, self.temperature, self.top_p)


GREEDY = Sampling()


def warp(logits: torch.Tensor, temperature: float, top_p: float | None = None) -> torch.Tensor:
    """Probabilities from logits [..., V] at ``temperature`` (> 0), optionally nucleus-filtered
    (the smallest set of top tokens whose mass reaches ``top_p``; the top token always stays)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs`` [n, V] -> [n] (on ``generator``'s device, returned on ``probs``')."""
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).view(-1).to(probs.device)


def sample_without_sync(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` [n, V] by an exponential race (``argmax p / E``, E ~ Exp(1)):
    distributed as multinomial sampling, but no host sync (for batched on-device decoding)."""
    return (probs / torch.empty_like(probs).exponential_()).argmax(-1)


def _uniform(n: int, device, generator: torch.Generator | None) -> torch.Tensor:
    gen_device = generator.device if generator is not None else device
    return torch.rand(n, generator=generator, device=gen_device).to(device)


def choose_next(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The target's next token from its logits [V] as a 0-d tensor (read it when the host needs
    it): argmax, or a sample of the warped distribution."""
    if sampling.greedy:
        return logits.argmax(-1)
    return sample(sampling.probs(logits).unsqueeze(0), sampling.generator)[0]


def next_token(logits: torch.Tensor, sampling: Sampling) -> int:
    """The target's next token from its logits [V]: argmax, or a sample of the warped distribution."""
    return int(choose_next(logits, sampling))


# ---------------------------------------------------------------------------------------
# proposals (the drafter's side)
# ---------------------------------------------------------------------------------------
@dataclass
class Proposal:
    """A drafted block after the anchor: ``tokens`` [n] (long); ``q`` [n, V]: the distribution
    each token was drawn from when sampling (the ``q`` of the rejection rule; a drafter that
    samples among top-k candidates gives a ``q`` that is zero outside them), None when greedy."""

    tokens: torch.Tensor
    q: torch.Tensor | None = None

    @property
    def num_draft(self) -> int:
        return int(self.tokens.shape[0])


class BlockChooser(Protocol):
    """Chooses a block's tokens from the drafter's output for the block's draft slots:
    ``hidden`` [n, H] (the drafter's final states), ``logits`` [n, V] (float, through the
    target's lm_head), ``anchor`` [1] (the verified token before slot 1). Greedy choosers must
    be pure tensor code without host syncs: the static engine calls them inside a CUDA graph."""

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
                 sampling: Sampling) -> Proposal: ...


def choose_independently(hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
                         sampling: Sampling) -> Proposal:
    """DFlash's chooser: every slot on its own, the argmax of its logits (greedy) or a sample
    of their warped distribution (sampling)."""
    return proposal_from_logits(logits, sampling)


def proposal_from_logits(logits: torch.Tensor, sampling: Sampling) -> Proposal:
    if sampling.greedy:
        return Proposal(logits.argmax(-1))
    q = sampling.probs(logits)
    return Proposal(sample(q, sampling.generator), q)


def block_chooser(drafter) -> BlockChooser:
    """The drafter's chooser: its own ``block_chooser`` attribute (a callable with the
    :class:`BlockChooser` signature), else its kind's (``decoding/choosers/``, by the kind's name),
    else DFlash's :func:`choose_independently`."""
    own = getattr(drafter, "block_chooser", None)
    if own is not None:
        return own
    from dflash_train.decoding.choosers import CHOOSERS

    kind = getattr(getattr(drafter, "kind", None), "name", "dflash")
    return CHOOSERS[kind](drafter) if kind in CHOOSERS else choose_independently


@runtime_checkable
class BlockProposer(Protocol):
    """What the speculative loops need from a drafter.

    ``feature_layer_ids``: target layers whose outputs it consumes (may be empty);
    ``block_size``: its native block size; ``reset()`` starts a new sequence.
    ``propose_block(tokens, new_features, num_draft, sampling)`` gets every committed token
    so far (the last one, the anchor, sits at position ``p = len(tokens) - 1`` and has not
    been seen by the target), the target features of the positions added since the previous
    call (``[1, m, n*h]``, positions ``p-m .. p-1``; None when ``feature_layer_ids`` is empty)
    and returns the :class:`Proposal` for positions ``p+1 .. p+num_draft``.
    """

    feature_layer_ids: list[int]
    block_size: int

    def reset(self) -> None: ...

    def propose_block(self, tokens: list[int], new_features: torch.Tensor | None, num_draft: int,
                      sampling: Sampling) -> Proposal: ...


@runtime_checkable
class LogitsProposer(Protocol):
    """A simpler drafter (test oracles, :class:`~.proposers.DFlashProposer`): ``propose`` returns
    draft logits ``[num_draft, V]``; :class:`FromLogits` makes it a :class:`BlockProposer`."""

    feature_layer_ids: list[int]
    block_size: int

    def reset(self) -> None: ...

    def propose(self, tokens: list[int], new_features: torch.Tensor | None, num_draft: int) -> torch.Tensor: ...


class FromLogits:
    """A :class:`LogitsProposer` as a :class:`BlockProposer`: drafts are the argmax of its
    logits, or samples of their warped distribution."""

    def __init__(self, inner: LogitsProposer) -> None:
        self.inner = inner
        self.feature_layer_ids = list(inner.feature_layer_ids)
        self.block_size = int(inner.block_size)

    def reset(self) -> None:
        self.inner.reset()

    def propose_block(self, tokens, new_features, num_draft, sampling: Sampling) -> Proposal:
        return proposal_from_logits(self.inner.propose(tokens, new_features, num_draft), sampling)


# ---------------------------------------------------------------------------------------
# acceptance
# ---------------------------------------------------------------------------------------
def leading_matches(drafts: list[int], choices: list[int]) -> int:
    """How many leading drafts equal the target's choices (greedy acceptance on host lists)."""
    return next((k for k, (d, c) in enumerate(zip(drafts, choices)) if d != c), min(len(drafts), len(choices)))


def greedy_accept(target_logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """``target_logits`` [n+1, V]: accept ``d_i`` while it equals the target's argmax at
    the previous position; the next token is the target's argmax after the last accepted."""
    choice = target_logits.argmax(-1)
    n = drafts.shape[0]
    accepted = int((drafts == choice[:n]).long().cumprod(0).sum()) if n else 0
    return accepted, int(choice[accepted])


def speculative_accept(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Speculative sampling over one block.

    ``p`` [n+1, V]: target probabilities at the n draft positions and the one after;
    ``q`` [n, V]: the drafter's probabilities the drafts were sampled from;
    ``drafts`` [n]. Draft ``i`` is accepted with probability ``min(1, p_i(d)/q_i(d))``;
    at the first rejection the next token is sampled from ``norm(max(p_i - q_i, 0))``;
    if all are accepted it is sampled from ``p_n``. Returns (accepted, next_token).
    The committed tokens are then distributed exactly as the target's ``p``.
    """
    n = drafts.shape[0]
    if n:
        rows = torch.arange(n, device=p.device)
        p_d, q_d = p[rows, drafts], q[rows, drafts]
        ok = _uniform(n, p.device, generator) * q_d < p_d  # P(ok) = min(1, p/q)
        accepted = int(ok.long().cumprod(0).sum())
    else:
        accepted = 0
    if accepted < n:
        residual = (p[accepted] - q[accepted]).clamp_min(0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[accepted]
    else:
        dist = p[n]
    return accepted, int(sample(dist.unsqueeze(0), generator)[0])


def accept(proposal: Proposal, target_logits: torch.Tensor, sampling: Sampling) -> tuple[int, int]:
    """(accepted drafts, next token) of one verify step: ``target_logits`` [n+1, V] are the
    target's logits at the anchor and at every draft."""
    if sampling.greedy:
        return greedy_accept(target_logits, proposal.tokens)
    if proposal.q is None and proposal.num_draft:
        raise ValueError("sampling needs the proposal's q (the distribution its drafts were drawn from)")
    return speculative_accept(sampling.probs(target_logits), proposal.q, proposal.tokens, sampling.generator)


# ---------------------------------------------------------------------------------------
# results and committing
# ---------------------------------------------------------------------------------------
@dataclass
class SpecResult:
    """One prompt's speculative decode.

    ``tokens``: new tokens (prompt excluded; the first is the prefill's). ``kept_lengths``:
    the tokens each verify step committed (after a cut at a stop token or the budget).
    ``acceptance_lengths``: each step's acceptance as verified (accepted drafts + 1, before
    any cut). ``position_reached[k-1]`` / ``position_accepted[k-1]``: how many verify steps
    reached / accepted draft position k (k = 1 .. B-1), as verified; P(k accepted | reached)
    is their ratio. Times in seconds; decode excludes the prefill (the first token).
    """

    tokens: list[int]
    acceptance_lengths: list[int]
    position_reached: list[int]
    position_accepted: list[int]
    block_size: int
    prefill_time: float = 0.0
    decode_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    kept_lengths: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, block_size: int) -> SpecResult:
        return cls([], [], [0] * (block_size - 1), [0] * (block_size - 1), block_size)

    @property
    def num_steps(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_tau(self) -> float:
        """Tau: tokens committed per verify step (0 when the decode ended at the prefill)."""
        return tally([self]).tau()

    @property
    def verified_tau(self) -> float:
        """Acceptance per step as verified, cut drafts included (the count before 2026-12-05)."""
        return tally([self]).verified_tau()

    @property
    def decode_tokens_per_s(self) -> float:
        return max(0, len(self.tokens) - 1) / self.decode_time if self.decode_time > 0 else 0.0


@dataclass
class GenResult:
    """Plain target decode. ``topk_values``/``topk_ids`` [steps, k] (when recorded): the
    target's top-k logits at every generated token (row i produced ``tokens[i]``)."""

    tokens: list[int]
    prefill_time: float = 0.0
    decode_time: float = 0.0
    topk_values: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    @property
    def decode_tokens_per_s(self) -> float:
        return max(0, len(self.tokens) - 1) / self.decode_time if self.decode_time > 0 else 0.0


def record_step(result: SpecResult, accepted: int, num_draft: int) -> None:
    """Per verify step: its acceptance as verified, and which draft positions were reached / accepted."""
    result.acceptance_lengths.append(accepted + 1)
    for k in range(min(accepted + 1, num_draft)):
        result.position_reached[k] += 1
    for k in range(accepted):
        result.position_accepted[k] += 1


def truncate(new: list[int], budget: int, stop: set[int]) -> tuple[list[int], bool]:
    """Cut ``new`` after the first stop token or at ``budget`` tokens; (kept, finished)."""
    for i, tok in enumerate(new[:budget]):
        if tok in stop:
            return new[: i + 1], True
    kept = new[:budget]
    return kept, len(kept) >= budget


class SpecLedger:
    """The committed side of one speculative decode: the first (prefill) token, then one
    :meth:`commit` per verify step, which records the step in :attr:`result` and says
    (:attr:`finished`) when a stop token or the ``max_new_tokens`` budget ends the decode."""

    def __init__(self, max_new_tokens: int, block_size: int, stop_token_ids=()) -> None:
        self.max_new_tokens, self.num_draft = int(max_new_tokens), int(block_size) - 1
        self.stop = {int(t) for t in stop_token_ids}
        self.result = SpecResult.empty(block_size)
        self.generated: list[int] = []
        self.finished = self.max_new_tokens <= 0

    def start(self, first: int) -> None:
        """The prefill's token."""
        self.generated = [int(first)]
        self.finished = first in self.stop or self.max_new_tokens <= 1

    def commit(self, drafts: list[int], accepted: int, next_token: int) -> list[int]:
        """Record a verify step that accepted ``drafts[:accepted]`` and chose ``next_token``;
        return the tokens it commits (cut at a stop token or the budget)."""
        new, self.finished = truncate(list(drafts[:accepted]) + [int(next_token)],
                                      self.max_new_tokens - len(self.generated), self.stop)
        record_step(self.result, accepted, self.num_draft)
        self.result.kept_lengths.append(len(new))
        self.generated += new
        return new

    @property
    def last(self) -> int:
        return self.generated[-1]

    def done(self) -> SpecResult:
        self.result.tokens = self.generated
        return self.result


# ---------------------------------------------------------------------------------------
# the loops: one speculative, one plain, over what each engine does its own way
# ---------------------------------------------------------------------------------------
class StepClock(Protocol):
    """Where an engine's loop reads time. ``wall()``: host seconds once the device's queued work is
    done (the prefill and decode totals); ``now()``: a mark taken at once (a step's start);
    ``mark()``: a mark after the work queued so far (a host sync, or an event on the device's
    timeline: the static engine's, which adds no sync); ``seconds(a, b)``: between two marks."""

    def wall(self) -> float: ...

    def now(self): ...

    def mark(self): ...

    def seconds(self, start, end) -> float: ...


class HostClock:
    """Host time, the device synchronized where a mark must wait for its work (the HF loops)."""

    def __init__(self, device) -> None:
        self.device = device

    def wall(self) -> float:
        from dflash_train.devices import synchronize

        synchronize(self.device)
        return time.perf_counter()

    def now(self) -> float:
        return time.perf_counter()

    def mark(self) -> float:
        return self.wall()

    def seconds(self, start, end) -> float:
        return end - start


class NoClock:
    """No timing (replay: a walk over stored tokens has no speed to measure); every time is 0."""

    def wall(self) -> float:
        return 0.0

    def now(self) -> float:
        return 0.0

    def mark(self) -> float:
        return 0.0

    def seconds(self, start, end) -> float:
        return 0.0


NO_CLOCK = NoClock()


class SpecSteps(Protocol):
    """What one engine does its own way in :func:`speculative_loop`: the verifier's side
    (``prefill``; ``verify`` a block; ``keep`` its verified prefix), the drafter's ``draft`` and
    the readout of acceptance (``accept``). The loop owns the rest: the ledger (stop token,
    token budget, what each step commits), the order of the calls and the timing.

    ``prefill(input_ids)`` -> the first new token (int). ``draft(generated)`` -> the block to
    verify after the committed tokens ``generated`` (the anchor is ``generated[-1]``); opaque to
    the loop. ``verify(block)`` runs the target over ``[anchor, drafts]`` and returns what
    ``accept`` reads; the loop marks the verify's end between the two, so an engine can launch
    in ``verify`` and sync in ``accept``. ``accept(pending)`` -> (drafts as a host list, at least
    the accepted ones; accepted drafts; the target's next token). ``keep(accepted)``: the
    verified positions (the anchor and the accepted drafts) become context; called only while
    the decode goes on."""

    def prefill(self, input_ids) -> int: ...

    def draft(self, generated: list[int]): ...

    def verify(self, block): ...

    def accept(self, pending) -> tuple[list[int], int, int]: ...

    def keep(self, accepted: int) -> None: ...


def speculative_loop(steps: SpecSteps, input_ids, max_new_tokens: int, block_size: int, stop_token_ids=(),
                     clock: StepClock | None = None) -> SpecResult:
    """The one speculative decode: the prefill's token, then draft / verify / accept / commit
    until a stop token or the budget (:class:`SpecLedger`); every engine (the HF cache, the
    static CUDA-graph engine, the replay walk) runs its steps through here, so they stop, cut
    and count alike. Times: prefill, decode (after the prefill), and per step the draft (from
    the step's start to the verify's launch) and the verify (to its end, ``clock.mark()``)."""
    ledger, clock = SpecLedger(max_new_tokens, block_size, stop_token_ids), clock or NO_CLOCK
    if ledger.finished:
        return ledger.done()
    result = ledger.result
    t0 = clock.wall()
    ledger.start(steps.prefill(input_ids))
    t1 = clock.wall()
    result.prefill_time = t1 - t0
    while not ledger.finished:
        _spec_step(steps, ledger, clock)
    result.decode_time = clock.wall() - t1
    return ledger.done()


def _spec_step(steps: SpecSteps, ledger: SpecLedger, clock: StepClock) -> None:
    result = ledger.result
    mark_draft = clock.now()
    block = steps.draft(ledger.generated)
    mark_verify = clock.mark()
    pending = steps.verify(block)
    mark_done = clock.mark()
    drafts, accepted, next_tok = steps.accept(pending)
    result.draft_time += clock.seconds(mark_draft, mark_verify)
    result.verify_time += clock.seconds(mark_verify, mark_done)
    ledger.commit(drafts, accepted, next_tok)
    if not ledger.finished:
        steps.keep(accepted)


class PlainSteps(Protocol):
    """What one engine does its own way in :func:`plain_loop`: ``prefill(input_ids)`` and
    ``step(token, position)`` (the target over one committed token at ``position``) each return
    (the last logits [V] float, the next token: an int or a one-element tensor the loop reads
    after recording the logits, so an engine's sync comes after every launch)."""

    def prefill(self, input_ids): ...

    def step(self, token: int, position: int): ...


def plain_loop(steps: PlainSteps, input_ids, max_new_tokens: int, stop_token_ids=(), record_topk: int = 0,
               clock: StepClock | None = None) -> GenResult:
    """The one plain decode: one token per target forward until a stop token or
    ``max_new_tokens``; prefill time to the first token, decode time after it; ``record_topk``
    keeps each step's top-k logits (:class:`TopK`)."""
    stop, clock = {int(t) for t in stop_token_ids}, clock or NO_CLOCK
    result, topk = GenResult([]), TopK(record_topk)
    if max_new_tokens <= 0:
        return result
    prompt_len = int(input_ids.shape[-1])
    t0 = clock.wall()
    tok = _plain_token(result, topk, *steps.prefill(input_ids))
    t1 = clock.wall()
    result.prefill_time = t1 - t0
    while tok not in stop and len(result.tokens) < max_new_tokens:
        tok = _plain_token(result, topk, *steps.step(tok, prompt_len + len(result.tokens) - 1))
    result.decode_time = clock.wall() - t1
    return topk.store(result)


def _plain_token(result: GenResult, topk: TopK, logits: torch.Tensor, choice) -> int:
    topk.add(logits)
    tok = int(choice)
    result.tokens.append(tok)
    return tok


# ---------------------------------------------------------------------------------------
# the one accounting: every engine's steps booked by the ledger, counted by one tally
# ---------------------------------------------------------------------------------------
_PLACEHOLDER = -1  # the token a booked step commits: an engine's counts carry no token ids


def book_steps(accepted, new_tokens: int | None, block_size: int | None = None) -> SpecResult:
    """Another engine's verify steps (``accepted[i]``: the drafts its step ``i`` accepted, in order)
    booked by our :class:`SpecLedger`, so llama.cpp's, vLLM's and our own steps are one kind of
    record: after the prefill's token, each step commits ``accepted + 1`` tokens until the
    engine's ``new_tokens`` are reached (the step that reaches them keeps what fits; the steps
    after it overran and are not booked). ``new_tokens`` None books every step uncut (the
    acceptance *as verified*). Token ids are placeholders; ``block_size`` (default: the largest
    acceptance + 1) sizes the per-position counts."""
    accepted = [int(a) for a in accepted]
    block = int(block_size) if block_size is not None else max(accepted, default=0) + 2
    budget = sum(accepted) + len(accepted) + 1 if new_tokens is None else int(new_tokens)
    ledger = SpecLedger(budget, block)
    if not ledger.finished:
        ledger.start(_PLACEHOLDER)
    for a in accepted:
        if ledger.finished:
            break
        ledger.commit([_PLACEHOLDER] * a, a, _PLACEHOLDER)
    return ledger.done()


def _ratio(num: float, den: float, empty: float) -> float:
    return num / den if den else empty


@dataclass
class Tally:
    """Ledger steps of some decodes (one entry per prompt), counted one way: the trainer's eval,
    replay, llama.cpp's and vLLM's reports all read tau and the per-position acceptance here.

    ``kept[i]`` / ``steps[i]``: the tokens prompt ``i``'s verify steps committed, and how many
    steps; ``verified``: every step's acceptance as verified (accepted drafts + 1, before a cut);
    ``position_reached[k-1]`` / ``position_accepted[k-1]``: steps that reached / accepted draft
    position k. ``empty`` arguments say what a count over no step is (callers differ: 0 or nan)."""

    kept: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    verified: list[int] = field(default_factory=list)
    position_reached: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return sum(self.steps)

    def tau(self, empty: float = 0.0) -> float:
        """Tau pooled over every verify step: kept tokens / steps."""
        return _ratio(sum(self.kept), self.num_steps, empty)

    def prompt_taus(self, empty: float = 0.0) -> list[float]:
        """Each prompt's own tau (``empty`` for one that ended at the prefill)."""
        return [_ratio(k, s, empty) for k, s in zip(self.kept, self.steps)]

    def per_prompt_tau(self, empty: float = 0.0) -> float:
        """The mean of the taus of the prompts with at least one verify step."""
        taus = [k / s for k, s in zip(self.kept, self.steps) if s]
        return _ratio(sum(taus), len(taus), empty)

    def verified_tau(self, empty: float = 0.0) -> float:
        """Acceptance per step as verified, cut drafts included."""
        return _ratio(sum(self.verified), len(self.verified), empty)

    def histogram(self, block_size: int) -> dict[str, int]:
        """Steps per acceptance length as verified (``"1"`` .. ``"B"``, and any longer seen)."""
        hist = {str(k): 0 for k in range(1, block_size + 1)}
        for t in self.verified:
            hist[str(t)] = hist.get(str(t), 0) + 1
        return hist

    def position_rates(self) -> list[float | None]:
        """P(position k accepted | reached) per draft position (None: never reached)."""
        return [a / r if r else None for a, r in zip(self.position_accepted, self.position_reached)]

    def position_shares(self, empty: float = 0.0) -> list[float]:
        """Per draft position: steps that accepted it / all steps (not conditional on the ones before)."""
        return [_ratio(a, len(self.verified), empty) for a in self.position_accepted]


def tally(results, num_draft: int | None = None) -> Tally:
    """The one count of tau: :class:`Tally` of these :class:`SpecResult` (ours, replayed, or an
    engine's steps through :func:`book_steps`); ``num_draft`` trims or pads the per-position
    counts (default: the first result's)."""
    results = list(results)
    n = num_draft if num_draft is not None else (len(results[0].position_reached) if results else 0)

    def positions(name: str) -> list[int]:
        return [sum(getattr(r, name)[k] for r in results if k < len(getattr(r, name))) for k in range(n)]

    return Tally(kept=[sum(r.kept_lengths) for r in results], steps=[len(r.kept_lengths) for r in results],
                 verified=[t for r in results for t in r.acceptance_lengths],
                 position_reached=positions("position_reached"), position_accepted=positions("position_accepted"))


class TopK:
    """The top-k logits of every plain-decode step (``k`` 0: nothing kept), for the lossless
    check's near-tie diagnosis."""

    def __init__(self, k: int) -> None:
        self.k, self.values, self.ids = int(k), [], []

    def add(self, logits: torch.Tensor) -> None:
        if self.k:
            v, i = logits.topk(self.k)  # topk allocates: a later graph replay does not overwrite these
            self.values.append(v)
            self.ids.append(i)

    def store(self, result: GenResult) -> GenResult:
        if self.k and self.values:
            result.topk_values = torch.stack(self.values).cpu()
            result.topk_ids = torch.stack(self.ids).cpu()
        return result


# ---------------------------------------------------------------------------------------
# compile settings (both static engines)
# ---------------------------------------------------------------------------------------
def compile_step(fn, mode: str | None = None, recompile_limit: int = 16):
    """``torch.compile(fn)`` with static shapes, as the static engines compile their steps:
    dynamo's recompile limit raised to at least ``recompile_limit`` (an engine compiles one
    function per step and shape; the default limit of 8 can stop compiling mid-run), and
    ``mode`` an inductor mode ("default" or None: the default)."""
    import torch._dynamo as dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), recompile_limit))
    return torch.compile(fn, dynamic=False, mode=None if mode in (None, "default") else mode)
