"""How each block position's loss is weighted (``objective.weighting``), by name.

A weighting turns the decay weights of spec 2.7 (``w_k = exp(-(k - 1) / gamma)`` on positions
with a label, 0 elsewhere) into the weights the loss uses, inside each chunk of the chunked
loss, from the drafter's own detached cross-entropy of the labels; and it names the step's
normalizer, a number known from the blocks alone before any forward (so that splitting a step
across micro-batches or ranks does not change it):

- ``decay`` (the paper's): the decay weights as they are; normalized by their sum.
- ``reach``: each weight times the drafter's probability of reaching the position in greedy
  verification (the product of its probabilities of the labels before it in the block);
  normalized by the decay weights' sum.
- ``dpace`` (D-PACE, arXiv 2605.18810): weights from the drafter's confidence at the block's
  positions replace the decay; normalized by the number of labels (docs/spec.md section 2b).

A new weighting is an entry in :data:`WEIGHTINGS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def reach_factor(ce: torch.Tensor, block_positions: int) -> torch.Tensor:
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


def dpace_weights(ce: torch.Tensor, mask: torch.Tensor, block_positions: int, alpha: float) -> torch.Tensor:
    """D-PACE's position weights (arXiv 2605.18810), per block of ``block_positions`` rows.

    q_k = exp(-CE_k) (detached), s_k = (1 - alpha) q_k + alpha (1 where masked), C_j = prod_{i<=j} s_i,
    w_k = m_k * sum_{j>=k} m_j C_j. With alpha = 0, sum_j C_j is the expected accepted length
    and w_k its derivative with respect to log q_k: a position weighs as much as everything after it
    that its acceptance unlocks. ``reach`` weighs by the probability of *reaching* k
    (prod_{i<k} q_i) alone; D-PACE adds the tail, and alpha keeps late positions from vanishing early on.
    """
    q = torch.exp(-ce.detach()).view(-1, block_positions)
    m = mask.view(-1, block_positions)
    cumulative = torch.cumprod(torch.where(m > 0, (1 - alpha) * q + alpha, torch.ones_like(q)), dim=1)
    tail = torch.flip(torch.cumsum(torch.flip(m * cumulative, [1]), dim=1), [1])
    return (m * tail).reshape(-1)


def _decay(weights, ce, block, alpha):
    return weights


def _reach(weights, ce, block, alpha):
    return weights * reach_factor(ce, block)


def _dpace(weights, ce, block, alpha):
    return dpace_weights(ce, (weights > 0).float(), block, alpha)


@dataclass(frozen=True)
class Weighting:
    """One entry: ``fn(decay weights, labels' CE, block positions, alpha) -> weights used`` (rows of a
    chunk); ``per_block``: it needs whole blocks in a chunk; ``by_label_count``: the step divides by
    the number of labels instead of the decay weights' sum."""

    name: str
    fn: Callable
    per_block: bool = False
    by_label_count: bool = False

    def normalizer(self, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the step's divisor: the decay weights' sum, or the label count."""
        return valid.sum().float() if self.by_label_count else weights.sum()


WEIGHTINGS = {w.name: w for w in (Weighting("decay", _decay), Weighting("reach", _reach, per_block=True),
                                   Weighting("dpace", _dpace, per_block=True, by_label_count=True))}
