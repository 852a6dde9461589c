"""Position-decayed cross-entropy through the frozen lm_head, in chunks (spec 2.7).

The logits of all block positions (``positions x vocab``, e.g. 8K x 152K floats =
5 GB for one Qwen3 sequence) are never alive at once: each chunk's logits are built,
reduced to a weighted CE sum, an argmax and the input gradient, and dropped. (Plain
activation checkpointing would rebuild every chunk's logits in backward: a third
lm_head pass that the frozen head makes unnecessary.) The anchor position (k = 0)
never has a label, so it is sliced away before the lm_head.

Each chunk's loss is a weighted sum of targets (``objective.targets``, ``objective/targets.py``:
the label's CE, the forward KL from or the total variation to the target's own next-token
distribution, whose logits are built chunk by chunk from its final hidden states at the
predicting positions through the same frozen lm_head), times each position's weight
(``objective.weighting``, ``objective/weighting.py``: the decay, times the drafter's chance of
reaching the position, or D-PACE's). A drafter kind may add a low-rank trainable bias to the
logits (its gradient is computed here too), ask for each row's top-k
candidates (DFlash2's selector) and add terms of its own after the chunks (``objective/kinds/``).

Nothing here calls ``.item()``: metrics stay on the device until the logger asks.

On CUDA the trainer runs each chunk through ``torch.compile`` (``compiled=True``): eager
PyTorch reads and writes the ``[chunk, vocab]`` float32 logits once per elementwise op
(max, subtract, exp, sum, log, gather, argmax, softmax, one-hot, scale, cast: ~10 passes of
805 MB per 4,096-row chunk for SmolLM2's 49K vocabulary), which made the loss 65% of a SmolLM2
step's GPU time on an H200 (17.6 of 27 ms); Inductor fuses them into a few reductions around
the two lm_head products. The one-hot is a comparison with the vocabulary index, not a
scatter: a scatter made Inductor store the float32 softmax (2.3 GB per 3,840-row chunk of
Qwen3's 152K vocabulary) and read it back in a second kernel; now one kernel reduces each row
and writes the bf16 input-gradient factor (the reference bench's peak memory 31.9 -> 30.8 GiB).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass

import torch

from dflash_train.objective.kinds import ChunkOutputs, KindTerms, TermInputs
from dflash_train.objective.targets import TARGETS
from dflash_train.objective.weighting import WEIGHTINGS

CE_ONLY = (("ce", 1.0),)


def _chunk_forward(hidden, lm_head, labels, weights, want_grad: bool, block: int = 0, weighting: str = "decay",
                   alpha: float = 0.5, top_k: int = 0, targets=CE_ONLY, target_hidden=None, bias_in=None,
                   bias_head=None):
    """One chunk: the weighted loss sum, argmax, and (optionally) the input gradients.

    The lm_head is frozen, so the only gradient needed on its side is the input gradient
    ``d loss / d logits * w @ W``; computing it here, while the logits exist, saves rebuilding
    them in backward (a third lm_head pass under plain checkpointing). ``bias_in`` [n, r] /
    ``bias_head`` [V, r] (a kind's logit bias, trainable): their gradients too. Also returns the
    weights used (detached) and, with ``top_k`` > 0, each row's top-k candidate ids.
    """
    logits = (hidden.to(lm_head.dtype) @ lm_head.t()).float()
    if bias_in is not None:
        logits = logits + (bias_in.to(bias_head.dtype) @ bias_head.t()).float()
    lse = torch.logsumexp(logits, dim=-1)
    ce = lse - logits.gather(1, labels.unsqueeze(1)).squeeze(1)
    argmax = logits.argmax(dim=-1)
    weights = WEIGHTINGS[weighting].fn(weights, ce, block, alpha)
    candidates = torch.topk(logits, top_k, dim=-1).indices if top_k else None
    p = None
    if target_hidden is not None:  # the target's own next-token distribution at each label's position
        p = torch.softmax((target_hidden.to(lm_head.dtype) @ lm_head.t()).float(), dim=-1)
    rows, grad = 0.0, None
    for name, coef in targets:
        term, term_grad = TARGETS[name].fn(logits, lse, labels, p, want_grad)
        rows = rows + coef * term
        if want_grad:
            grad = coef * term_grad if grad is None else grad + coef * term_grad
    grads = (None, None, None)
    if want_grad:
        factor = grad * weights.unsqueeze(1)
        grads = (factor.to(lm_head.dtype) @ lm_head,
                 None if bias_in is None else factor.to(bias_head.dtype) @ bias_head,
                 None if bias_in is None else factor.t().to(bias_in.dtype) @ bias_in)
    return (rows * weights).sum(), argmax, weights, candidates, *grads


class _CompiledOrEager:
    """``fn`` through ``torch.compile`` (static shapes: a step's chunks have at most two sizes);
    if compiling fails, one warning and the eager ``fn`` from then on: the fusion is a speed-up,
    never a reason for a run to stop."""

    def __init__(self, fn):
        self.eager, self.compiled = fn, torch.compile(fn, dynamic=False)

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as err:  # noqa: BLE001 - a compiler failure, not a data error
                warnings.warn(f"compiled loss chunk failed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); using the eager chunk", stacklevel=2)
                self.compiled = None
        return self.eager(*args)


@functools.cache
def _compiled(fn):
    """The compiled version of ``fn``, built once per process."""
    return _CompiledOrEager(fn)


@dataclass(frozen=True)
class LossOptions:
    """How the chunked loss runs.

    ``chunk_size``: rows of logits alive at once. ``targets``: ((name, weight), ...), the
    ``objective.targets`` mix. ``compiled``: each chunk through ``torch.compile`` (the trainer's choice
    on CUDA). ``block``: rows come in blocks of this many consecutive positions (needed by the
    per-block weightings; chunks then hold whole blocks). ``weighting``: an ``objective/weighting.py``
    entry. ``top_k`` > 0: also return each row's top-k candidate ids.
    """

    chunk_size: int = 4096
    targets: tuple = CE_ONLY
    compiled: bool = False
    block: int = 0
    weighting: str = "decay"
    dpace_alpha: float = 0.5
    top_k: int = 0

    def __post_init__(self):
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"objective.weighting must be one of {list(WEIGHTINGS)}, got {self.weighting!r}")
        if WEIGHTINGS[self.weighting].per_block and self.block < 1:
            raise ValueError(f"weighting {self.weighting!r} needs the block length (block >= 1)")
        if not 0.0 <= self.dpace_alpha <= 1.0:
            raise ValueError(f"objective.dpace_alpha must be in [0, 1], got {self.dpace_alpha}")
        unknown = [name for name, _ in self.targets if name not in TARGETS]
        if unknown:
            raise ValueError(f"objective.targets: unknown {unknown}; known: {list(TARGETS)}")

    @property
    def needs_target(self) -> bool:
        return any(TARGETS[name].needs_target for name, _ in self.targets)


class _ChunkedLinearLoss(torch.autograd.Function):
    """sum(w * loss(hidden @ W^T [+ bias_in @ bias_head^T], labels)) with W frozen, chunk by chunk.

    Peak extra memory is one chunk of fp32 logits; the saved tensors for backward are the input
    gradients themselves ([n, h], the size of ``hidden``; and the bias's, [n, r] and [V, r]).
    """

    @staticmethod
    def forward(ctx, hidden, lm_head, labels, weights, opts: LossOptions, target_hidden=None, bias_in=None,
                bias_head=None):
        biased = bias_in is not None
        want_grad = hidden.requires_grad or (biased and (bias_in.requires_grad or bias_head.requires_grad))
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        outs = []
        chunk_fn = _compiled(_chunk_forward) if opts.compiled else _chunk_forward
        chunk = _even_chunk(hidden.shape[0], opts.chunk_size, max(1, opts.block))
        head_grad = None
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            loss, argmax, used, cands, g_hidden, g_bias_in, g_bias_head = chunk_fn(
                hidden[part], lm_head, labels[part], weights[part], want_grad, opts.block, opts.weighting,
                opts.dpace_alpha, opts.top_k, opts.targets, None if target_hidden is None else target_hidden[part],
                None if not biased else bias_in[part], bias_head)
            total = total + loss
            outs.append((argmax, used, cands, g_hidden, g_bias_in))
            if g_bias_head is not None:
                head_grad = g_bias_head if head_grad is None else head_grad + g_bias_head
        argmax, used, cands, g_hidden, g_bias_in = (list(x) for x in zip(*outs))
        if want_grad:
            ctx.save_for_backward(torch.cat(g_hidden).to(hidden.dtype),
                                  *((torch.cat(g_bias_in).to(bias_in.dtype), head_grad.to(bias_head.dtype))
                                    if biased else ()))
        argmax, used = torch.cat(argmax), torch.cat(used)
        cands = torch.cat(cands) if opts.top_k else torch.zeros(0, dtype=torch.long, device=hidden.device)
        ctx.mark_non_differentiable(argmax, used, cands)
        return total, argmax, used, cands

    @staticmethod
    def backward(ctx, grad_total, *_unused):
        grad_hidden, *bias = ctx.saved_tensors
        scale = grad_total.to(grad_hidden.dtype)
        grad_in, grad_head = (g * scale.to(g.dtype) for g in bias) if bias else (None, None)
        return grad_hidden * scale, None, None, None, None, None, grad_in, grad_head


def chunked_weighted_ce(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    opts: LossOptions | None = None,
    target_hidden: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sum_i w_i * loss_i, argmax_i)`` over flattened positions (see :func:`chunked_loss_parts`)."""
    total, argmax, _, _ = chunked_loss_parts(hidden, lm_head, labels, weights, opts, target_hidden)
    return total, argmax


def chunked_loss_parts(hidden, lm_head, labels, weights, opts: LossOptions | None = None, target_hidden=None,
                       bias=None):
    """``(sum_i w_i * loss_i, argmax_i, w_i used, top-k candidate ids or an empty tensor)``.

    ``hidden`` [n, h], ``lm_head`` [vocab, h] (frozen), ``labels``/``weights`` [n].
    Full (n x vocab) logits never exist: at most ``opts.chunk_size`` rows at a time.
    ``target_hidden`` [n, h] (targets that read the target's distribution): the target's final
    hidden state at the position predicting each label (no gradient flows into the target's
    side). ``bias``: ``(bias_in [n, r], bias_head [V, r])`` added to the logits as
    ``bias_in @ bias_head.T``, trainable. The weights used are the weighting's; they are detached.
    """
    opts = opts or LossOptions()
    if lm_head.requires_grad:
        raise ValueError("the lm_head is frozen in DFlash training; got one that requires grad")
    if opts.needs_target != (target_hidden is not None):
        raise ValueError("objective.targets kl/tv need the target's final hidden states (and only they read them)")
    if target_hidden is not None:
        target_hidden = target_hidden.detach()
    if opts.block and hidden.shape[0] % opts.block:
        raise ValueError(f"{hidden.shape[0]} rows are not whole blocks of {opts.block} positions")
    bias_in, bias_head = bias if bias is not None else (None, None)
    return _ChunkedLinearLoss.apply(hidden, lm_head, labels, weights.float(), opts, target_hidden, bias_in, bias_head)


chunked_ce_parts = chunked_loss_parts  # the name tests and benches used before targets existed


def _even_chunk(rows: int, chunk_size: int, align: int = 1) -> int:
    """The chunk size that splits ``rows`` into as many chunks as ``chunk_size`` would, as
    evenly as possible (15,360 rows at 4,096: four chunks of 3,840, not three of 4,096 and one of
    3,072), so a compiled chunk usually sees one shape; a multiple of ``align`` (rows are whole
    groups of ``align``: a chunk never cuts one)."""
    chunks = max(1, -(-rows // chunk_size))
    groups = -(-rows // align)
    return -(-groups // chunks) * align


@dataclass
class LossOutput:
    """Sums, not means: the caller divides by the step's normalizer (``objective/weighting.py``)."""

    weighted_ce: torch.Tensor  # scalar: sum of w * loss (+ the kind's own terms)
    correct: torch.Tensor  # [rows, A, K] bool, the draft equals the label (positions 1..K; K = B-1 unless limited)
    valid: torch.Tensor  # [rows, A, K] bool
    logs: dict | None = None  # the kind's terms' device scalars, by name (e.g. selector_ce)


def dflash_loss(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    valid: torch.Tensor,
    opts: LossOptions | None = None,
    target_hidden: torch.Tensor | None = None,
    last_position: int | None = None,
    kind: KindTerms | None = None,
    drafter=None,
    anchor_ids: torch.Tensor | None = None,
    kind_options: dict | None = None,
) -> LossOutput:
    """Loss pieces of one micro-batch. ``hidden`` [rows, A*B, h]; labels/weights/valid [rows, A, B].

    ``target_hidden`` [rows, A, B-1, h] (targets reading the target's distribution): the target's
    final hidden state at the position predicting each label of positions 1..B-1 (see
    ``blocks.predicting_positions``). ``last_position`` (None: B - 1): only positions
    1..last_position reach the lm_head (their labels must be the only valid ones: the
    blocks were built with the same limit); ``correct``/``valid`` then have that many.
    ``kind`` (with ``drafter``, ``anchor_ids`` [rows, A] and its ``kind_options``): the drafter kind's
    additions (``objective/kinds/``); ``correct`` then compares what the kind's decoder would emit.
    """
    opts = opts or LossOptions()
    rows, num_blocks, block_size = labels.shape
    end = block_size if last_position is None else last_position + 1
    hidden = hidden.view(rows, num_blocks, block_size, -1)[:, :, 1:end]
    full_labels, labels, weights, valid = labels, labels[:, :, 1:end], weights[:, :, 1:end], valid[:, :, 1:end]
    if target_hidden is not None:
        target_hidden = target_hidden[:, :, : end - 1].reshape(-1, target_hidden.shape[-1])
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    kind = kind or KindTerms()
    inputs = None
    if anchor_ids is not None:
        prev = torch.cat([anchor_ids.unsqueeze(-1), full_labels[:, :, 1 : end - 1]], dim=-1)
        inputs = TermInputs(flat_hidden, flat_labels, prev.reshape(-1), valid.reshape(-1), lm_head, opts.chunk_size)
    block = (end - 1) if WEIGHTINGS[opts.weighting].per_block else 0
    top_k = kind.top_k(drafter) if inputs is not None else 0
    opts = dataclasses.replace(opts, block=block, top_k=top_k)
    bias = kind.logit_bias(drafter, inputs) if inputs is not None else None
    total, argmax, used, candidates = chunked_loss_parts(flat_hidden, lm_head, flat_labels, weights.reshape(-1), opts,
                                                         target_hidden, bias)
    extra = kind.terms(drafter, inputs, ChunkOutputs(argmax, used, candidates), kind_options or {}) \
        if inputs is not None else None
    picks = argmax if extra is None or extra.picks is None else extra.picks
    correct = (picks.view_as(labels) == labels) & valid
    if extra is None:
        return LossOutput(total, correct, valid)
    return LossOutput(total + extra.total, correct, valid, extra.logs)


def reference_loss(hidden, lm_head, labels, weights, valid, reach: bool = False) -> torch.Tensor:
    """Unchunked ``sum(w * CE) / sum(w)`` with full logits: the test reference. ``reach``
    (weights [..., K], positions last): w times the detached product of the softmax
    probabilities of the labels at the earlier positions, by an explicit loop."""
    logits = (hidden @ lm_head.t()).float()
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view_as(weights)
    factor = torch.ones_like(weights)
    if reach:
        p_label = logits.softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).detach().view_as(weights)
        for j in range(1, weights.shape[-1]):
            factor[..., j] = factor[..., j - 1] * p_label[..., j - 1]
    return (ce * weights * factor).sum() / weights.sum()


@dataclass
class AcceptanceStats:
    """Device-side counters accumulated over a logging window."""

    correct_per_position: torch.Tensor  # [B-1]
    valid_per_position: torch.Tensor  # [B-1]
    accepted_sum: torch.Tensor  # sum over blocks of (1 + leading correct positions)
    blocks: torch.Tensor  # number of kept blocks


def acceptance_stats(correct: torch.Tensor, valid: torch.Tensor, keep: torch.Tensor) -> AcceptanceStats:
    """Per-position accuracy counts and the expected acceptance length per block.

    A block's acceptance is 1 + the number of leading positions predicted right (the
    product of per-position correctness, summed over k); a position without a label
    ends the run, since nothing there can be verified.
    """
    leading = torch.cumprod(correct.long(), dim=-1).sum(-1)  # [rows, A]
    keep = keep.to(leading.device)
    return AcceptanceStats(
        correct_per_position=correct.sum(dim=(0, 1)).float(),
        valid_per_position=valid.sum(dim=(0, 1)).float(),
        accepted_sum=((1 + leading) * keep).sum().float(),
        blocks=keep.sum().float(),
    )
