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
(max, subtract, exp, sum, log, gather, argmax, softmax, scatter, scale, cast: ~10 passes of
805 MB per 4,096-row chunk for SmolLM2's 49K vocabulary), which made the loss 65% of a SmolLM2
step's GPU time on an H200 (17.6 of 27 ms); Inductor fuses them into a few reductions around
the two lm_head products.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F


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


def _chunk_forward(hidden, lm_head, labels, weights, want_grad: bool, reach_block: int = 0):
    """One chunk: weighted CE sum, argmax, and (optionally) d(sum w*CE)/d(hidden).

    The lm_head is frozen, so the only gradient needed is the input gradient
    ``(softmax - onehot) * w @ W``; computing it here, while the logits exist, saves
    rebuilding them in backward (a third lm_head pass under plain checkpointing).
    ``reach_block`` > 0 (``train.reach_weighting``): the chunk holds whole blocks of that many
    positions, and each weight is multiplied by ``_reach`` before the sum and the gradient.
    """
    logits = (hidden.to(lm_head.dtype) @ lm_head.t()).float()
    lse = torch.logsumexp(logits, dim=-1)
    ce = lse - logits.gather(1, labels.unsqueeze(1)).squeeze(1)
    argmax = logits.argmax(dim=-1)
    if reach_block:
        weights = weights * _reach(ce, reach_block)
    grad = None
    if want_grad:
        probs = torch.exp(logits - lse.unsqueeze(1))
        probs.scatter_add_(1, labels.unsqueeze(1), -torch.ones_like(lse).unsqueeze(1))
        grad = (probs * weights.unsqueeze(1)).to(lm_head.dtype) @ lm_head
    return (ce * weights).sum(), argmax, grad


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
    return (ce * weights).sum(), argmax, grad


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


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum(w * CE(hidden @ W^T, labels)) with W frozen, chunk by chunk.

    Peak extra memory is one chunk of fp32 logits; the saved tensor for backward is
    the input gradient itself ([n, h], the size of ``hidden``).
    """

    @staticmethod
    def forward(ctx, hidden, lm_head, labels, weights, chunk_size, target_hidden=None, distill=0.0,
                compiled=False, reach_block=0):
        want_grad = hidden.requires_grad
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        argmaxes, grads = [], []
        chunk_fn = _chunk_forward if target_hidden is None else _chunk_forward_soft
        chunk_fn = _compiled(chunk_fn) if compiled else chunk_fn
        for start in range(0, hidden.shape[0], chunk_size):
            part = slice(start, start + chunk_size)
            extra = (reach_block,) if target_hidden is None else (target_hidden[part], distill)
            loss, argmax, grad = chunk_fn(hidden[part], lm_head, labels[part], weights[part], want_grad, *extra)
            total = total + loss
            argmaxes.append(argmax)
            grads.append(grad)
        if want_grad:
            ctx.save_for_backward(torch.cat(grads).to(hidden.dtype))
        ctx.mark_non_differentiable(argmaxes[0])
        return total, torch.cat(argmaxes)

    @staticmethod
    def backward(ctx, grad_total, _grad_argmax):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None, None, None, None, None


def chunked_weighted_ce(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    chunk_size: int = 4096,
    target_hidden: torch.Tensor | None = None,
    distill: float = 0.0,
    compiled: bool = False,
    reach_block: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sum_i w_i * CE_i, argmax_i)`` over flattened positions.

    ``hidden`` [n, h], ``lm_head`` [vocab, h] (frozen), ``labels``/``weights`` [n].
    Full (n x vocab) logits never exist: at most ``chunk_size`` rows at a time.
    ``target_hidden`` [n, h] (``train.distill`` > 0): the target's final hidden state at
    the position predicting each label; CE_i is then against the soft target
    ``(1 - distill) * onehot + distill * softmax(target_hidden_i @ W^T)`` (no gradient
    flows into the target's side). ``compiled``: each chunk through ``torch.compile`` (the
    trainer's choice on CUDA; same values up to float rounding). ``reach_block`` > 0: the rows
    are blocks of that many consecutive positions, and w_i is multiplied by the drafter's
    probability of reaching position i (``_reach``; chunks then hold whole blocks).
    """
    if lm_head.requires_grad:
        raise ValueError("the lm_head is frozen in DFlash training; got one that requires grad")
    if target_hidden is not None:
        target_hidden = target_hidden.detach()
        if reach_block:
            raise ValueError("train.reach_weighting does not combine with train.distill")
    if reach_block and hidden.shape[0] % reach_block:
        raise ValueError(f"{hidden.shape[0]} rows are not whole blocks of {reach_block} positions")
    chunk = _even_chunk(hidden.shape[0], chunk_size, max(1, reach_block))
    return _ChunkedLinearCrossEntropy.apply(hidden, lm_head, labels, weights.float(), chunk, target_hidden,
                                            float(distill), compiled, int(reach_block))


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

    weighted_ce: torch.Tensor  # scalar, sum of w * CE
    weight_sum: torch.Tensor  # scalar, sum of w
    correct: torch.Tensor  # [rows, A, K] bool, argmax == label (positions 1..K; K = B-1 unless limited)
    valid: torch.Tensor  # [rows, A, K] bool


def dflash_loss(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    valid: torch.Tensor,
    chunk_size: int = 4096,
    target_hidden: torch.Tensor | None = None,
    distill: float = 0.0,
    compiled: bool = False,
    last_position: int | None = None,
    reach_weighting: bool = False,
) -> LossOutput:
    """Loss pieces of one micro-batch. ``hidden`` [rows, A*B, h]; labels/weights/valid [rows, A, B].

    ``target_hidden`` [rows, A, B-1, h] (distillation only): the target's final hidden
    state at the position predicting each label of positions 1..B-1 (see
    ``blocks.predicting_positions``). ``last_position`` (None: B - 1): only positions
    1..last_position reach the lm_head (their labels must be the only valid ones: the
    blocks were built with the same limit); ``correct``/``valid`` then have that many.
    ``reach_weighting``: each weight times the drafter's probability of reaching that position
    (``_reach``); ``weight_sum`` stays the sum of the plain weights (what the trainer divides by)."""
    rows, num_blocks, block_size = labels.shape
    end = block_size if last_position is None else last_position + 1
    hidden = hidden.view(rows, num_blocks, block_size, -1)[:, :, 1:end]
    labels, weights, valid = labels[:, :, 1:end], weights[:, :, 1:end], valid[:, :, 1:end]
    if target_hidden is not None:
        target_hidden = target_hidden[:, :, : end - 1].reshape(-1, target_hidden.shape[-1])
    weighted_ce, argmax = chunked_weighted_ce(
        hidden.reshape(-1, hidden.shape[-1]), lm_head, labels.reshape(-1), weights.reshape(-1), chunk_size,
        target_hidden, distill, compiled, (end - 1) if reach_weighting else 0,
    )
    correct = (argmax.view_as(labels) == labels) & valid
    return LossOutput(weighted_ce, weights.sum(), correct, valid)


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
