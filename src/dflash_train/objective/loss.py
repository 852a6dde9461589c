"""Position-decayed cross-entropy through the frozen lm_head, in chunks (spec 2.7).

The logits of all block positions (``positions x vocab``, e.g. 8K x 152K floats =
5 GB for one Qwen3 sequence) are never alive at once: each chunk's logits are built,
reduced to a weighted CE sum, an argmax and the input gradient, and dropped. (Plain
activation checkpointing would rebuild every chunk's logits in backward: a third
lm_head pass that the frozen head makes unnecessary.) The anchor position (k = 0)
never has a label, so it is sliced away before the lm_head.

With ``train.reach_weighting`` each position's weight is also multiplied by the drafter's
own (detached) probability that greedy verification reaches it: the product of its
probabilities of the labels at the block's earlier positions (see ``_reach``).

With ``train.distill`` > 0 each label's target is soft, ``(1 - distill) * onehot +
distill * softmax(target logits)``, the target's logits built chunk by chunk from its
final hidden states at the predicting positions through the same frozen lm_head.

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
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _reach(ce: torch.Tensor, block_positions: int) -> torch.Tensor:
    """The probability that verification reaches each position: ``prod_{i<j} p_i`` per block.

    ``ce`` [blocks * block_positions] holds each position's CE, so ``p = exp(-ce)`` is the
    drafter's probability of the label there; a block's positions are contiguous. Position 1
    is always reached (1). Detached: the factor weighs the CE, it is not itself optimized.
    Why: greedy verification accepts position j only if positions 1..j-1 were right, so
    the CE of a position after a likely miss teaches what tau never uses; with this factor,
    sum_j reach_j * CE_j follows the drafter's own acceptance block by block, where a fixed
    decay over positions follows only the average one.
    """
    p = torch.exp(-ce.detach()).view(-1, block_positions)  # ce is float32 (the logits are)
    reached = torch.cumprod(p, dim=1)
    return torch.cat([torch.ones_like(reached[:, :1]), reached[:, :-1]], dim=1).reshape(-1)


def _dpace(ce: torch.Tensor, mask: torch.Tensor, block_positions: int, alpha: float) -> torch.Tensor:
    """D-PACE's position weights (arXiv 2605.18810), per block of ``block_positions`` rows.

    q_k = exp(-CE_k) (detached), s_k = (1 - alpha) q_k + alpha (1 where masked), C_j = prod_{i<=j} s_i,
    w_k = m_k * sum_{j>=k} m_j C_j. With alpha = 0, sum_j C_j is the expected accepted length
    and w_k its derivative with respect to log q_k: a position weighs as much as everything after it
    that its acceptance unlocks. ``train.reach_weighting`` weighs by the probability of *reaching* k
    (prod_{i<k} q_i) alone; D-PACE adds the tail, and alpha keeps late positions from vanishing early on.
    """
    q = torch.exp(-ce.detach()).view(-1, block_positions)
    m = mask.view(-1, block_positions)
    cumulative = torch.cumprod(torch.where(m > 0, (1 - alpha) * q + alpha, torch.ones_like(q)), dim=1)
    tail = torch.flip(torch.cumsum(torch.flip(m * cumulative, [1]), dim=1), [1])
    return (m * tail).reshape(-1)


def _chunk_forward(hidden, lm_head, labels, weights, want_grad: bool, block: int = 0, weighting: str = "decay",
                   alpha: float = 0.5, top_k: int = 0):
    """One chunk: weighted CE sum, argmax, and (optionally) d(sum w*CE)/d(hidden).

    The lm_head is frozen, so the only gradient needed is the input gradient
    ``(softmax - onehot) * w @ W``; computing it here, while the logits exist, saves
    rebuilding them in backward (a third lm_head pass under plain checkpointing).
    ``weighting`` "reach" / "dpace" (the chunk holds whole blocks of ``block`` positions):
    each weight times ``_reach``, or replaced by ``_dpace`` of the label mask (weights > 0).
    Also returns the weights used (detached) and, with ``top_k`` > 0, each row's top-k
    candidate ids (DFlash2's selector scores them).
    """
    logits = (hidden.to(lm_head.dtype) @ lm_head.t()).float()
    lse = torch.logsumexp(logits, dim=-1)
    ce = lse - logits.gather(1, labels.unsqueeze(1)).squeeze(1)
    argmax = logits.argmax(dim=-1)
    if weighting == "reach":
        weights = weights * _reach(ce, block)
    elif weighting == "dpace":
        weights = _dpace(ce, (weights > 0).float(), block, alpha)
    candidates = torch.topk(logits, top_k, dim=-1).indices if top_k else None
    grad = None
    if want_grad:  # softmax - onehot as one pointwise expression (a scatter would make Inductor store it)
        is_label = torch.arange(logits.shape[1], device=logits.device) == labels.unsqueeze(1)
        probs = torch.exp(logits - lse.unsqueeze(1)) - is_label.to(logits.dtype)
        grad = (probs * weights.unsqueeze(1)).to(lm_head.dtype) @ lm_head
    return (ce * weights).sum(), argmax, grad, weights, candidates


def _soft_targets(target_hidden, lm_head, labels, distill: float) -> torch.Tensor:
    """q = (1 - distill) * onehot(label) + distill * softmax(target_hidden @ W^T), one chunk.

    ``target_hidden`` is the target's final (normed) hidden state at the position that
    predicts each label, so the softmax is the target's own next-token distribution there.
    """
    q = torch.softmax((target_hidden.to(lm_head.dtype) @ lm_head.t()).float(), dim=-1) * distill
    return q.scatter_add_(1, labels.unsqueeze(1), torch.full_like(q[:, :1], 1.0 - distill))


def _chunk_forward_soft(hidden, lm_head, labels, weights, want_grad: bool, target_hidden, distill: float):
    """``_chunk_forward`` against soft targets q (sum to 1): CE = lse - sum(q * logits),
    input gradient ``(softmax - q) * w @ W``. Both logits (drafter's, target's) exist only
    for this chunk."""
    logits = (hidden.to(lm_head.dtype) @ lm_head.t()).float()
    lse = torch.logsumexp(logits, dim=-1)
    q = _soft_targets(target_hidden, lm_head, labels, distill)
    ce = lse - (q * logits).sum(dim=-1)
    argmax = logits.argmax(dim=-1)
    grad = None
    if want_grad:  # softmax - q in the logits' own storage: one [chunk, vocab] buffer less at the peak
        probs = logits.sub_(lse.unsqueeze(1)).exp_().sub_(q)
        grad = (probs * weights.unsqueeze(1)).to(lm_head.dtype) @ lm_head
    return (ce * weights).sum(), argmax, grad, weights, None


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
    """How the chunked loss runs (was nine positional arguments; issue 37 point 4).

    ``chunk_size``: rows of logits alive at once. ``distill`` > 0: soft targets (``train.distill``).
    ``compiled``: each chunk through ``torch.compile`` (the trainer's choice on CUDA).
    ``block``: rows come in blocks of this many consecutive positions (needed by "reach"/"dpace";
    chunks then hold whole blocks). ``weighting``: "decay" (the given weights), "reach"
    (``train.reach_weighting``: times ``_reach``), "dpace" (``train.objective: dpace``: ``_dpace`` of
    the label mask replaces them). ``top_k`` > 0: also return each row's top-k candidate ids.
    """

    chunk_size: int = 4096
    distill: float = 0.0
    compiled: bool = False
    block: int = 0
    weighting: str = "decay"
    dpace_alpha: float = 0.5
    top_k: int = 0

    def __post_init__(self):
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"loss weighting must be one of {list(WEIGHTINGS)}, got {self.weighting!r}")
        if self.weighting != "decay" and self.block < 1:
            raise ValueError(f"weighting {self.weighting!r} needs the block length (block >= 1)")
        if self.weighting != "decay" and self.distill > 0:
            other = "train.reach_weighting" if self.weighting == "reach" else "train.objective=dpace"
            raise ValueError(f"train.distill > 0 does not combine with {other}")
        if not 0.0 <= self.dpace_alpha <= 1.0:
            raise ValueError(f"train.dpace_alpha must be in [0, 1], got {self.dpace_alpha}")


WEIGHTINGS = ("decay", "reach", "dpace")


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum(w * CE(hidden @ W^T, labels)) with W frozen, chunk by chunk.

    Peak extra memory is one chunk of fp32 logits; the saved tensor for backward is
    the input gradient itself ([n, h], the size of ``hidden``).
    """

    @staticmethod
    def forward(ctx, hidden, lm_head, labels, weights, opts: LossOptions, target_hidden=None):
        want_grad = hidden.requires_grad
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        outs = []
        chunk_fn = _chunk_forward if target_hidden is None else _chunk_forward_soft
        chunk_fn = _compiled(chunk_fn) if opts.compiled else chunk_fn
        chunk = _even_chunk(hidden.shape[0], opts.chunk_size, max(1, opts.block))
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            extra = ((opts.block, opts.weighting, opts.dpace_alpha, opts.top_k) if target_hidden is None
                     else (target_hidden[part], opts.distill))
            loss, *rest = chunk_fn(hidden[part], lm_head, labels[part], weights[part], want_grad, *extra)
            total = total + loss
            outs.append(rest)
        argmax, grads, used, cands = (list(x) for x in zip(*outs))
        if want_grad:
            ctx.save_for_backward(torch.cat(grads).to(hidden.dtype))
        argmax, used = torch.cat(argmax), torch.cat(used)
        cands = torch.cat(cands) if opts.top_k else torch.zeros(0, dtype=torch.long, device=hidden.device)
        ctx.mark_non_differentiable(argmax, used, cands)
        return total, argmax, used, cands

    @staticmethod
    def backward(ctx, grad_total, *_unused):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None, None


def chunked_weighted_ce(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    opts: LossOptions | None = None,
    target_hidden: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sum_i w_i * CE_i, argmax_i)`` over flattened positions (see :func:`chunked_ce_parts`)."""
    total, argmax, _, _ = chunked_ce_parts(hidden, lm_head, labels, weights, opts, target_hidden)
    return total, argmax


def chunked_ce_parts(hidden, lm_head, labels, weights, opts: LossOptions | None = None, target_hidden=None):
    """``(sum_i w_i * CE_i, argmax_i, w_i used, top-k candidate ids or an empty tensor)``.

    ``hidden`` [n, h], ``lm_head`` [vocab, h] (frozen), ``labels``/``weights`` [n].
    Full (n x vocab) logits never exist: at most ``opts.chunk_size`` rows at a time.
    ``target_hidden`` [n, h] (``train.distill`` > 0): the target's final hidden state at
    the position predicting each label; CE_i is then against the soft target
    ``(1 - distill) * onehot + distill * softmax(target_hidden_i @ W^T)`` (no gradient
    flows into the target's side). The weights used are the given ones ("decay"), times the
    reach probability ("reach"), or D-PACE's ("dpace"); they are detached.
    """
    opts = opts or LossOptions()
    if lm_head.requires_grad:
        raise ValueError("the lm_head is frozen in DFlash training; got one that requires grad")
    if target_hidden is not None:
        target_hidden = target_hidden.detach()
        if opts.weighting != "decay" or opts.top_k:
            raise ValueError("train.distill combines with neither reach/D-PACE weighting nor the DFlash2 selector")
    if opts.block and hidden.shape[0] % opts.block:
        raise ValueError(f"{hidden.shape[0]} rows are not whole blocks of {opts.block} positions")
    return _ChunkedLinearCrossEntropy.apply(hidden, lm_head, labels, weights.float(), opts, target_hidden)


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
    """Sums, not means: the caller normalizes by the global weight of the step."""

    weighted_ce: torch.Tensor  # scalar, sum of w * CE (+ the DFlash2 selector's sum of w * CE)
    weight_sum: torch.Tensor  # scalar, sum of w (D-PACE: the number of labels, see dflash_loss)
    correct: torch.Tensor  # [rows, A, K] bool, the draft equals the label (positions 1..K; K = B-1 unless limited)
    valid: torch.Tensor  # [rows, A, K] bool
    selector_ce: torch.Tensor | None = None  # DFlash2: the selector's share of weighted_ce (for logging)


OUT_OF_TOPK = ("inject", "exclude")  # train.selector_out_of_topk's choices, the default first


@dataclass(frozen=True)
class SelectorTargets:
    """What DFlash2's selector CE needs besides the hidden states: the selector module, each block's
    anchor token ([rows, A]: slot 1's predecessor) and what to do where the label is not among
    the top-k candidates (``train.selector_out_of_topk``, see :func:`selector_ce`)."""

    selector: torch.nn.Module
    anchor_ids: torch.Tensor
    out_of_topk: str = OUT_OF_TOPK[0]


def dflash_loss(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    valid: torch.Tensor,
    opts: LossOptions | None = None,
    target_hidden: torch.Tensor | None = None,
    last_position: int | None = None,
    selector: SelectorTargets | None = None,
) -> LossOutput:
    """Loss pieces of one micro-batch. ``hidden`` [rows, A*B, h]; labels/weights/valid [rows, A, B].

    ``target_hidden`` [rows, A, B-1, h] (distillation only): the target's final hidden
    state at the position predicting each label of positions 1..B-1 (see
    ``blocks.predicting_positions``). ``last_position`` (None: B - 1): only positions
    1..last_position reach the lm_head (their labels must be the only valid ones: the
    blocks were built with the same limit); ``correct``/``valid`` then have that many.
    ``opts.weighting``: "reach" multiplies each weight by the drafter's probability of reaching
    the position; ``weight_sum`` stays the sum of the plain weights (what the trainer divides by).
    "dpace" replaces the decay by D-PACE's weights and ``weight_sum`` is the number of labels:
    a count fixed by the data, like the plain weights' sum, so the trainer's global normalizer
    stays independent of the drafter's own (detached) confidence and equal across micro-batches
    and ranks; normalizing by sum(m * w) instead would rescale every step by the model's current
    acceptance and undo the emphasis D-PACE puts on confident blocks.
    ``selector`` (DFlash2): adds the selector CE (:func:`selector_ce`) with the same weights, and
    ``correct`` then compares the selector's teacher-forced pick (what decoding emits) to the label.
    """
    opts = opts or LossOptions()
    rows, num_blocks, block_size = labels.shape
    end = block_size if last_position is None else last_position + 1
    hidden = hidden.view(rows, num_blocks, block_size, -1)[:, :, 1:end]
    full_labels, labels, weights, valid = labels, labels[:, :, 1:end], weights[:, :, 1:end], valid[:, :, 1:end]
    if target_hidden is not None:
        target_hidden = target_hidden[:, :, : end - 1].reshape(-1, target_hidden.shape[-1])
    block = (end - 1) if opts.weighting != "decay" else 0
    opts = dataclasses.replace(opts, block=block, top_k=selector.selector.top_k if selector else 0)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    weighted_ce, argmax, used, candidates = chunked_ce_parts(flat_hidden, lm_head, labels.reshape(-1),
                                                             weights.reshape(-1), opts, target_hidden)
    weight_sum = valid.sum().float() if opts.weighting == "dpace" else weights.sum()
    if selector is None:
        return LossOutput(weighted_ce, weight_sum, (argmax.view_as(labels) == labels) & valid, valid)
    predecessors = torch.cat([selector.anchor_ids.unsqueeze(-1), full_labels[:, :, 1 : end - 1]], dim=-1)
    sel_sum, picks = selector_ce(selector.selector, flat_hidden, lm_head, labels.reshape(-1), predecessors.reshape(-1),
                                 candidates, used, selector.out_of_topk, opts.chunk_size)
    correct = (picks.view_as(labels) == labels) & valid
    return LossOutput(weighted_ce + sel_sum, weight_sum, correct, valid, sel_sum.detach())


def _selector_scores(selector, hidden, lm_head, candidates, predecessors):
    """S over the candidates of a chunk of rows; U is the drafter's logit of each candidate, built
    from the k lm_head rows only (its gradient reaches the drafter through ``hidden``)."""
    unary = torch.einsum("nh,nkh->nk", hidden.to(lm_head.dtype), lm_head[candidates]).float()
    return selector.scores(selector.hidden_projection(hidden), unary, candidates, predecessors).float()


def selector_ce(selector, hidden, lm_head, labels, predecessors, candidates, weights, out_of_topk=OUT_OF_TOPK[0],
                chunk_size=4096):
    """DFlash2's selector loss: ``sum_i w_i * CE(S_i, index of label_i among the candidates)``, and
    each row's greedy pick, with the predecessor teacher-forced (the label before; slot 1: the anchor).

    ``candidates`` [n, k] come from the drafter's logits, best first (``chunked_ce_parts``).
    A label outside its top-k: ``out_of_topk="inject"`` (the default, as SpecForge and speculators)
    puts the label in the last (lowest-logit) slot; "exclude" (NeMo) drops the row from this term.
    The case for exclude: decoding only ever ranks the top-k of the drafter's own logits, so an
    injected label trains S on candidate sets the walk never sees. The case for inject: a row whose
    label missed the top-k (most rows at late block positions early in training) still teaches the
    selector's codebooks, and S's unary part, the label's own logit, gets the selector's gradient
    too. Measured (SmolLM2 recipe, one H200, 1.1 minutes each, replayed on the 40 held-out prompts;
    docs/results, 2026-12-04): inject beat exclude by +0.044 +- 0.016 tau on prompts 1-24 (16/24)
    and +0.027 +- 0.016 on all 40, so it is the default. Chunks run under checkpointing: the
    gathered [chunk, k, h] lm_head rows exist one chunk at a time, in backward too.
    """
    if out_of_topk not in OUT_OF_TOPK:
        raise ValueError(f"train.selector_out_of_topk must be one of {list(OUT_OF_TOPK)}, got {out_of_topk!r}")
    hit = candidates == labels.unsqueeze(-1)
    present = hit.any(-1)
    if out_of_topk == "inject":
        candidates = candidates.clone()
        candidates[:, -1] = torch.where(present, candidates[:, -1], labels)
        hit = candidates == labels.unsqueeze(-1)
        row_weights = weights
    else:
        row_weights = weights * present
    target = hit.long().argmax(-1)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    picks = []
    for start in range(0, hidden.shape[0], chunk_size):
        part = slice(start, start + chunk_size)
        scores = checkpoint(_selector_scores, selector, hidden[part], lm_head, candidates[part], predecessors[part],
                            use_reentrant=False)
        ce = F.cross_entropy(scores, target[part], reduction="none")
        total = total + (ce * row_weights[part]).sum()
        picks.append(candidates[part].gather(1, scores.detach().argmax(-1, keepdim=True)).squeeze(1))
    picks = torch.cat(picks)
    return total, torch.where(present, picks, torch.full_like(picks, -1))


def reference_loss(hidden, lm_head, labels, weights, valid, reach: bool = False) -> torch.Tensor:
    """Unchunked ``sum(w * CE) / sum(w)`` with full logits: the test reference. ``reach``
    (weights [..., K], positions last): w times the detached product of the softmax
    probabilities of the labels at the earlier positions, by an explicit loop."""
    logits = (hidden @ lm_head.t()).float()
    ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view_as(weights)
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
