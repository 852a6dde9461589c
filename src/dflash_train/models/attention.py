"""The DFlash training attention mask (spec 2.5) as flex ``mask_mod`` functions.

Layout of one training forward: queries are ``num_blocks * block_size`` block
positions; keys are ``[context 0..s-1 ; all blocks]``. Block ``j`` (anchor ``a_j``):

* context key ``k < s`` is visible iff ``k < a_j`` -- strictly: at inference the
  anchor token's own target hidden state does not exist yet;
* block keys are visible iff they belong to block ``j`` (bidirectional);
* invalid (padding) blocks see nothing; their rows output zeros.
* sliding layers additionally need ``k >= pos(q) - (W - 1)`` for context keys and
  are causal inside the block.
* packed rows (several conversations per row, ``data.pack``): a context key must
  also belong to the anchor's conversation, i.e. ``k >= start_j``, the first row
  index of that conversation. Conversations are contiguous, so one lower bound per
  block replaces a per-key document lookup and keeps the mask block-sparse.
  ``starts=None`` (unpacked rows) is ``start_j = 0``.

The same ``mask_mod`` feeds both backends: evaluated on broadcast index tensors it
gives the dense bool mask of the CPU/SDPA path; inside partial tiles of the
block-sparse flex ``BlockMask`` (its tiles computed from the anchors, ``block_mask.py``)
it decides each element (``H=None``: the mask is head-independent,
and a per-head mask would multiply its memory by the head count).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dflash_train.models.block_mask import dflash_block_mask
from dflash_train.models.config import FULL_ATTENTION, SLIDING_ATTENTION

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def document_layout(doc_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(starts, positions)`` of packed rows, both [b, s] like ``doc_ids``.

    ``doc_ids`` names each token's conversation (any id; padding is its own run);
    conversations are contiguous runs. ``starts[b, t]`` is the row index where t's run
    begins and ``positions = t - starts``: token positions restart at 0 in every
    conversation, exactly as if it had a row of its own.
    """
    seq = doc_ids.shape[-1]
    index = torch.arange(seq, device=doc_ids.device).expand_as(doc_ids)
    new = torch.ones_like(doc_ids, dtype=torch.bool)
    new[..., 1:] = doc_ids[..., 1:] != doc_ids[..., :-1]
    starts = torch.where(new, index, torch.zeros_like(index)).cummax(dim=-1).values
    return starts, index - starts


def _context_visible(kv_idx, anchor, start):
    """Context key ``kv_idx`` is strictly before the anchor, inside the anchor's conversation."""
    visible = kv_idx < anchor  # implies kv_idx < context_len, since anchor < context_len
    return visible if start is None else visible & (kv_idx >= start)


def full_block_mask_mod(anchors: torch.Tensor, keep: torch.Tensor, context_len: int, block_size: int,
                        starts: torch.Tensor | None = None) -> MaskMod:
    """mask_mod for full-attention layers. ``anchors``/``keep``/``starts``: [b, num_blocks]."""

    def dflash_full(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        anchor = anchors[b, block]
        sees_context = _context_visible(kv_idx, anchor, None if starts is None else starts[b, block])
        own_block = (kv_idx >= context_len) & ((kv_idx - context_len) // block_size == block)
        return keep[b, block] & (sees_context | own_block)

    return dflash_full


def sliding_block_mask_mod(
    anchors: torch.Tensor, keep: torch.Tensor, context_len: int, block_size: int, window: int,
    starts: torch.Tensor | None = None,
) -> MaskMod:
    """mask_mod for sliding-window layers: context within ``window`` of the query's
    real position, causal inside the block (how serving engines run such layers)."""

    def dflash_sliding(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        offset = q_idx % block_size
        anchor = anchors[b, block]
        position = anchor + offset
        start = None if starts is None else starts[b, block]
        sees_context = _context_visible(kv_idx, anchor, start) & (kv_idx > position - window)
        in_block = kv_idx - context_len
        own_block = (kv_idx >= context_len) & (in_block // block_size == block) & (in_block % block_size <= offset)
        return keep[b, block] & (sees_context | own_block)

    return dflash_sliding


def mask_mods(
    layer_types: list[str], anchors, keep, context_len: int, block_size: int, sliding_window: int | None,
    starts=None,
) -> dict[str, MaskMod]:
    """One mask_mod per layer type present in the drafter (``starts``: packed rows, else None)."""
    mods: dict[str, MaskMod] = {}
    if FULL_ATTENTION in layer_types:
        mods[FULL_ATTENTION] = full_block_mask_mod(anchors, keep, context_len, block_size, starts)
    if SLIDING_ATTENTION in layer_types:
        assert sliding_window is not None
        mods[SLIDING_ATTENTION] = sliding_block_mask_mod(anchors, keep, context_len, block_size, sliding_window,
                                                         starts)
    return mods


def dense_mask(mask_mod: MaskMod, batch: int, q_len: int, kv_len: int, device) -> torch.Tensor:
    """Evaluate a mask_mod on every (b, q, kv): a [b, 1, q, kv] bool tensor for SDPA."""
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q = torch.arange(q_len, device=device).view(1, 1, q_len, 1)
    kv = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
    return mask_mod(b, h, q, kv)


def decode_masks(
    layer_types, anchor, context_len: int, block_size: int, sliding_window: int | None = None, device=None,
) -> dict[str, torch.Tensor | None]:
    """The drafter's masks for one decoding step: the training mask_mods for a single block.

    Queries: the block at positions ``anchor .. anchor+B-1``; keys: ``context_len``
    context keys (key ``k`` holds position ``k``), then the block. Building them from
    :func:`mask_mods` makes inference see exactly what training taught: context strictly
    before the anchor (so a static cache's stale or scratch slots at or after it stay
    hidden), the whole block for full layers, window + causal block for sliding ones.

    ``anchor``: a Python int, or a one-element device tensor (a CUDA-graphed step reads it
    without a host sync). When it is an int and the whole context precedes it (a cache
    that grows with the committed tokens), full layers get ``None``: every key is
    visible, and the no-mask attention path is the one the reference decoder measures.
    Returns ``{layer type: [1, 1, B, context_len + B] bool or None}``.
    """
    anchors = torch.as_tensor(anchor, dtype=torch.long, device=device).view(1, 1)
    keep = torch.ones(1, 1, dtype=torch.bool, device=anchors.device)
    mods = mask_mods(list(layer_types), anchors, keep, context_len, block_size, sliding_window)
    all_visible = isinstance(anchor, int) and context_len <= anchor
    return {name: None if name == FULL_ATTENTION and all_visible
            else dense_mask(mod, 1, block_size, context_len + block_size, anchors.device)
            for name, mod in mods.items()}


def flex_block_masks(
    layer_types: tuple[str, ...], anchors, keep, context_len: int, block_size: int, sliding_window: int | None,
    starts=None,
) -> dict[str, object]:
    """Block-sparse flex BlockMasks (``H=None``: shared by all heads), one per layer type,
    computed from the anchors' intervals (``block_mask.py``): no dense mask, no compile."""
    mods = mask_mods(list(layer_types), anchors, keep, context_len, block_size, sliding_window, starts)
    return {name: dflash_block_mask(mod, anchors, keep, context_len, block_size,
                                    sliding_window if name == SLIDING_ATTENTION else None, starts)
            for name, mod in mods.items()}


def build_masks(
    backend: str,
    layer_types: list[str],
    anchors: torch.Tensor,
    keep: torch.Tensor,
    context_len: int,
    block_size: int,
    sliding_window: int | None = None,
    starts: torch.Tensor | None = None,
) -> dict[str, object]:
    """Build each layer type's mask once per batch, outside the layers.

    ``backend`` is ``"sdpa"`` (dense bool masks) or ``"flex"`` (block-sparse BlockMask).
    ``starts`` [b, num_blocks]: where each block's conversation begins in a packed row.
    """
    batch, num_blocks = anchors.shape
    q_len, kv_len = num_blocks * block_size, context_len + num_blocks * block_size
    if backend == "sdpa":
        mods = mask_mods(layer_types, anchors, keep, context_len, block_size, sliding_window, starts)
        return {name: dense_mask(mod, batch, q_len, kv_len, anchors.device) for name, mod in mods.items()}
    if backend == "flex":
        types = tuple(sorted(set(layer_types)))
        return flex_block_masks(types, anchors, keep, context_len, block_size, sliding_window, starts)
    raise ValueError(f"unknown attention backend {backend!r}; use 'sdpa' or 'flex'")
