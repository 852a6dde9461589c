"""Position-decayed cross-entropy through the frozen lm_head, in chunks (spec 2.7).

The logits of all block positions (``positions x vocab``, e.g. 8K x 152K floats =
5 GB for one Qwen3 sequence) are never alive at once: each chunk's logits are built,
reduced to a weighted CE sum and an argmax, and dropped; under activation
checkpointing the backward pass rebuilds one chunk at a time. The anchor position
(k = 0) never has a label, so it is sliced away before the lm_head.

Nothing here calls ``.item()``: metrics stay on the device until the logger asks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_ce(hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    logits = (hidden @ lm_head.t()).float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (ce * weights).sum(), logits.argmax(dim=-1)


def chunked_weighted_ce(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    chunk_size: int = 4096,
    use_checkpoint: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sum_i w_i * CE_i, argmax_i)`` over flattened positions.

    ``hidden`` [n, h], ``lm_head`` [vocab, h], ``labels``/``weights`` [n].
    """
    total = hidden.new_zeros((), dtype=torch.float32)
    predictions = []
    for start in range(0, hidden.shape[0], chunk_size):
        part = slice(start, start + chunk_size)
        args = (hidden[part], lm_head, labels[part], weights[part])
        if use_checkpoint and torch.is_grad_enabled():
            loss, argmax = checkpoint(_chunk_ce, *args, use_reentrant=False)
        else:
            loss, argmax = _chunk_ce(*args)
        total = total + loss
        predictions.append(argmax)
    return total, torch.cat(predictions)


@dataclass
class LossOutput:
    """Sums, not means: the caller normalizes by the global weight of the step."""

    weighted_ce: torch.Tensor  # scalar, sum of w * CE
    weight_sum: torch.Tensor  # scalar, sum of w
    correct: torch.Tensor  # [rows, A, B-1] bool, argmax == label (positions 1..B-1)
    valid: torch.Tensor  # [rows, A, B-1] bool


def dflash_loss(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    valid: torch.Tensor,
    chunk_size: int = 4096,
    use_checkpoint: bool = True,
) -> LossOutput:
    """Loss pieces of one micro-batch. ``hidden`` [rows, A*B, h]; labels/weights/valid [rows, A, B]."""
    rows, num_blocks, block_size = labels.shape
    hidden = hidden.view(rows, num_blocks, block_size, -1)[:, :, 1:]
    labels, weights, valid = labels[:, :, 1:], weights[:, :, 1:], valid[:, :, 1:]
    weighted_ce, argmax = chunked_weighted_ce(
        hidden.reshape(-1, hidden.shape[-1]), lm_head, labels.reshape(-1), weights.reshape(-1), chunk_size, use_checkpoint
    )
    correct = (argmax.view_as(labels) == labels) & valid
    return LossOutput(weighted_ce, weights.sum(), correct, valid)


def reference_loss(hidden, lm_head, labels, weights, valid) -> torch.Tensor:
    """Unchunked ``sum(w * CE) / sum(w)`` with full logits: the test reference."""
    logits = (hidden @ lm_head.t()).float()
    ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view_as(weights)
    return (ce * weights).sum() / weights.sum()


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
