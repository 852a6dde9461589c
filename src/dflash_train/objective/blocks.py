"""Anchors, blocks, labels and loss weights of the DFlash objective (spec 2.2-2.7).

Anchors are sampled on the CPU while a batch is collated, from a generator seeded by
(seed, epoch, sample id): every sequence gets fresh anchors each time it is seen, the
draw is independent of which rank or micro-batch holds the sequence (so every
topology trains on identical blocks), and resuming a run reproduces it exactly with
no RNG state to carry. The width is fixed (``num_anchors``) with a ``keep`` mask, so
compiled GPU code sees static shapes.

Packed rows (``data.pack``) hold several conversations; ``doc_ids`` [rows, seq] names
each token's conversation (its sample id, -1 on padding). Nothing crosses a
conversation boundary: an anchor and its next token share a conversation, a label
counts only inside the anchor's conversation, and positions restart at 0 in each
conversation (``document_layout``), so a packed block is computed exactly as it would
be in a row of its own. ``doc_ids=None`` means one conversation per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dflash_train.models.attention import document_layout


def anchor_generator(seed: int, epoch: int, sample_id: int) -> torch.Generator:
    """A generator private to one sighting of one sequence."""
    state = np.random.SeedSequence([seed, epoch, sample_id]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def anchor_candidates(loss_mask: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Positions ``a`` with loss_mask[a] == 1 and loss_mask[a + 1] == 1 (1-D mask), and
    (packed rows) ``a + 1`` in the same conversation as ``a``."""
    ok = (loss_mask[:-1] > 0) & (loss_mask[1:] > 0)
    if doc_ids is not None:
        ok &= doc_ids[:-1] == doc_ids[1:]
    return ok.nonzero().flatten()


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator):
    """Up to ``num_anchors`` distinct valid anchors, uniformly at random, sorted.

    Returns ``(anchors, keep)``, both of length ``num_anchors``; unused slots hold
    anchor 0 with keep False.
    """
    candidates = anchor_candidates(loss_mask)
    n = min(num_anchors, candidates.numel())
    chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:n]].sort().values
    anchors = torch.zeros(num_anchors, dtype=torch.long)
    keep = torch.zeros(num_anchors, dtype=torch.bool)
    anchors[:n] = chosen
    keep[:n] = True
    return anchors, keep


def sample_packed_anchors(loss_mask: torch.Tensor, doc_ids: torch.Tensor, num_anchors: int, seed: int, epoch: int):
    """Anchors of one packed row: uniform over the union of its conversations' candidates.

    Each candidate gets a uniform random key from its own conversation's generator
    (seeded by the sample id, so the keys do not depend on the row's other
    conversations); the ``num_anchors`` smallest keys win. Returns ``(anchors, keep)``.
    """
    candidates = anchor_candidates(loss_mask, doc_ids)
    keys = torch.empty(candidates.numel())
    owner = doc_ids[candidates]
    for sample_id in owner.unique().tolist():
        here = owner == sample_id
        generator = anchor_generator(seed, epoch, int(sample_id))
        keys[here] = torch.rand(int(here.sum()), generator=generator)
    n = min(num_anchors, candidates.numel())
    chosen = candidates[keys.argsort()[:n]].sort().values
    anchors = torch.zeros(num_anchors, dtype=torch.long)
    keep = torch.zeros(num_anchors, dtype=torch.bool)
    anchors[:n], keep[:n] = chosen, True
    return anchors, keep


def sample_batch_anchors(loss_mask: torch.Tensor, sample_ids: torch.Tensor, num_anchors: int, seed: int, epoch: int,
                         doc_ids: torch.Tensor | None = None):
    """[rows, num_anchors] anchors and keep for a micro-batch (padding rows keep nothing).
    ``doc_ids`` (packed micro-batches): each token's sample id, -1 on padding."""
    rows = loss_mask.shape[0]
    anchors = torch.zeros(rows, num_anchors, dtype=torch.long)
    keep = torch.zeros(rows, num_anchors, dtype=torch.bool)
    for row in range(rows):
        sample_id = int(sample_ids[row])
        if sample_id < 0:
            continue
        if doc_ids is not None:
            anchors[row], keep[row] = sample_packed_anchors(loss_mask[row], doc_ids[row], num_anchors, seed, epoch)
            continue
        generator = anchor_generator(seed, epoch, sample_id)
        anchors[row], keep[row] = sample_anchors(loss_mask[row], num_anchors, generator)
    return anchors, keep


def uniform_anchors(loss_mask: torch.Tensor, num_anchors: int, block_size: int, doc_ids: torch.Tensor | None = None):
    """Ablation baseline: fixed, non-overlapping blocks every ``block_size`` tokens.

    Blocks start at the first supervised position (of each conversation, in packed
    rows) and tile the sequence; a block is kept if its anchor is a valid anchor.
    (Paper ablation: random anchors 5.64 vs fixed uniform blocks 4.94.)
    """
    rows, seq = loss_mask.shape
    anchors = torch.zeros(rows, num_anchors, dtype=torch.long)
    keep = torch.zeros(rows, num_anchors, dtype=torch.bool)
    for row in range(rows):
        docs = None if doc_ids is None else doc_ids[row]
        candidates = set(anchor_candidates(loss_mask[row], docs).tolist())
        if not candidates:
            continue
        firsts = [min(candidates)] if docs is None else sorted(
            min(a for a in candidates if docs[a] == d) for d in {int(docs[a]) for a in candidates})
        ends = firsts[1:] + [seq]
        starts = [a for first, end in zip(firsts, ends) for a in range(first, end, block_size) if a in candidates]
        starts = starts[:num_anchors]
        anchors[row, : len(starts)] = torch.tensor(starts, dtype=torch.long)
        keep[row, : len(starts)] = True
    return anchors, keep


def decay_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-(k - 1) / gamma) for k >= 1 and 0 for the anchor position k = 0."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    # a product, not ``weights[0] = 0``: assigning a Python number copies it from the host (a
    # host-to-device copy per step, which a CUDA graph capture refuses)
    return torch.exp(-(k - 1) / gamma) * (k > 0)


@dataclass
class Blocks:
    """Everything one drafter forward over a micro-batch needs (all on one device)."""

    tokens: torch.Tensor  # [rows, A * B] block input ids: [anchor token, MASK, ...] per block
    positions: torch.Tensor  # [rows, A * B] absolute positions a_j + k
    labels: torch.Tensor  # [rows, A, B] same-position labels x[a_j + k] (0 where invalid)
    weights: torch.Tensor  # [rows, A, B] decay weight, 0 where no label counts
    valid: torch.Tensor  # [rows, A, B] bool: the label counts
    anchors: torch.Tensor  # [rows, A]
    keep: torch.Tensor  # [rows, A]
    # Packed rows only (None otherwise): per-conversation positions of the context
    # [rows, seq], and the row index where each block's conversation starts [rows, A].
    context_positions: torch.Tensor | None = None
    starts: torch.Tensor | None = None


def build_blocks(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    keep: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    gamma: float,
    doc_ids: torch.Tensor | None = None,
    last_position: int | None = None,
) -> Blocks:
    """Spec 2.3 and 2.6: block tokens, positions, same-position labels, weights.

    Block position ``k >= 1`` predicts ``x[a_j + k]``; it counts only if
    ``a_j + k < S`` and ``loss_mask[a_j + k]`` (and the block is kept), ``k <=
    last_position`` (``objective.loss_positions``; None: every position), and, in packed
    rows (``doc_ids`` given), ``x[a_j + k]`` is in the anchor's conversation. Positions
    are then the conversation's own (restarting at 0), not the row's.
    """
    rows, seq = input_ids.shape
    offsets = torch.arange(block_size, device=input_ids.device)
    index = anchors.unsqueeze(-1) + offsets  # [rows, A, B] row indices
    in_range = index < seq
    gather_at = index.clamp(max=seq - 1).flatten(1)
    labels = input_ids.gather(1, gather_at).view_as(index)
    supervised = loss_mask.gather(1, gather_at).view_as(index) > 0
    last = block_size - 1 if last_position is None else last_position
    valid = in_range & supervised & keep.unsqueeze(-1) & (offsets > 0) & (offsets <= last)
    positions, context_positions, starts = index, None, None
    if doc_ids is not None:
        row_starts, context_positions = document_layout(doc_ids)
        starts = row_starts.gather(1, anchors)
        positions = context_positions.gather(1, anchors).unsqueeze(-1) + offsets
        same_doc = doc_ids.gather(1, gather_at).view_as(index) == doc_ids.gather(1, anchors).unsqueeze(-1)
        valid &= same_doc
    labels = torch.where(valid, labels, torch.zeros_like(labels))
    weights = decay_weights(block_size, gamma, input_ids.device) * valid
    tokens = torch.full_like(index, mask_token_id)
    tokens[..., 0] = input_ids.gather(1, anchors)
    return Blocks(tokens.flatten(1), positions.flatten(1), labels, weights, valid, anchors, keep,
                  context_positions, starts)


def predicting_positions(blocks: Blocks) -> torch.Tensor:
    """[rows, A, B-1] row index of the target position that predicts each label (k >= 1).

    The causal target's state at ``t`` predicts ``x[t + 1]``, so label ``x[a_j + k]`` is
    predicted at ``a_j + k - 1``: inside the anchor's conversation whenever the label counts.
    Where it does not (weight 0), the anchor itself stands in, always a valid index.
    """
    block_size = blocks.labels.shape[-1]
    offsets = torch.arange(block_size - 1, device=blocks.anchors.device)
    index = blocks.anchors.unsqueeze(-1) + offsets  # a_j + k - 1 for k = 1..B-1
    return torch.where(blocks.valid[..., 1:], index, blocks.anchors.unsqueeze(-1))


def predicting_states(blocks: Blocks, target_hidden: torch.Tensor) -> torch.Tensor:
    """[rows, A, B-1, h]: the target's final hidden states [rows, s, h] at ``predicting_positions``."""
    at = predicting_positions(blocks)
    hidden = target_hidden.shape[-1]
    return target_hidden.gather(1, at.flatten(1).unsqueeze(-1).expand(-1, -1, hidden)).view(*at.shape, hidden)


def default_gamma(block_size: int) -> float:
    """Paper's loss decay: 7 for B=16, 5 for B=10, 4 for B=8; linear in between."""
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    return table.get(block_size, max(1.0, 4.0 + (block_size - 8) * 3.0 / 8.0))


def expected_acceptance_from_accuracy(accuracy: list[float]) -> float:
    """1 + sum_k prod_{i<=k} acc_i from per-position accuracies (positions 1..B-1)."""
    total, running = 1.0, 1.0
    for acc in accuracy:
        if math.isnan(acc):
            break
        running *= acc
        total += running
    return total
