"""The DFlash flex ``BlockMask`` computed from the anchors, without evaluating the mask.

``create_block_mask`` finds which (query tile, key tile) pairs are empty, partial or full by
evaluating the ``mask_mod`` on every (query, key) pair. Uncompiled it builds the dense
(q, kv) mask; compiled, its Triton kernel took ~2.5 minutes of LLVM time on an H200 for the
reference shapes (8192 queries x 11264 keys): most of the first step on an empty cache.

The DFlash mask needs none of that, because each block's visible keys are two intervals:

* context keys ``[lo_j, a_j)``: ``lo_j`` is 0, or the first token of the anchor's
  conversation in a packed row (``starts``), or for sliding layers the lowest key within
  the window of the block's first row; every row of the block sees ``[flo_j, a_j)`` with
  ``flo_j`` the same bound for the block's LAST row (the window moves with the row);
* the block's own keys ``[S + j*B, S + (j+1)*B)``.

So per query tile (``TILE`` rows, covering a few blocks) the partial key tiles are those
meeting any block's intervals, and a context key tile is full when it lies inside every
block's ``[flo_j, a_j)`` (and no block of the tile is padding). Key tiles of the blocks
themselves are always partial (the mask_mod sorts out block-diagonal visibility inside).
This is O(query tiles x blocks x key tiles) small tensor work on the device, no host sync,
no compile. Partial where a tile is in fact full, or listed where it is in fact empty,
would only cost speed (the ``mask_mod`` still decides every element); a tile left out
that has a visible key would be wrong, which ``tests`` check against the dense mask.
"""

from __future__ import annotations

import torch

TILE = 128  # flex_attention's default sparse block size, for queries and keys


def _tile_membership(num_blocks: int, block_size: int, q_tiles: int, device) -> torch.Tensor:
    """[q_tiles, num_blocks] bool: block j has rows in query tile i."""
    first_row = torch.arange(num_blocks, device=device) * block_size
    tile_start = torch.arange(q_tiles, device=device)[:, None] * TILE
    return (first_row[None] < tile_start + TILE) & (first_row[None] + block_size > tile_start)


def _ordered(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts [b, 1, qt], indices [b, 1, qt, kt]) of the selected key tiles, selected first.

    Contiguous: the CUDA flex kernels index these with row-major strides of their own
    (``selected`` comes out of an einsum in [qt, b, kt] memory order, and argsort keeps it;
    on an H200 that gave wrong outputs and illegal memory accesses, while CPU flex was right).
    """
    counts = selected.sum(-1, dtype=torch.int32)
    order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[:, None].contiguous(), order[:, None].contiguous()


def dflash_block_mask(mask_mod, anchors: torch.Tensor, keep: torch.Tensor, context_len: int, block_size: int,
                      window: int | None = None, starts: torch.Tensor | None = None):
    """The ``BlockMask`` (H=None) of one layer type; ``mask_mod`` decides inside partial tiles.

    ``anchors``/``keep``/``starts`` [b, num_blocks]; ``window``: sliding layers' W, else None.
    """
    from torch.nn.attention.flex_attention import BlockMask

    batch, num_blocks = anchors.shape
    q_len, kv_len = num_blocks * block_size, context_len + num_blocks * block_size
    q_tiles, kv_tiles = -(-q_len // TILE), -(-kv_len // TILE)
    device = anchors.device
    member = _tile_membership(num_blocks, block_size, q_tiles, device)  # [qt, nb]
    lo = torch.zeros_like(anchors) if starts is None else starts.to(anchors.dtype)
    full_lo = lo
    if window is not None:  # row offset o of block j sees context keys > a_j + o - W
        full_lo = torch.maximum(lo, anchors + block_size - window)
        lo = torch.maximum(lo, anchors - window + 1)
    valid = keep.bool() & (anchors > lo)

    key_start = torch.arange(kv_tiles, device=device) * TILE  # [kt]
    key_end = key_start + TILE
    # context: tile t meets [lo_j, a_j) of a valid block j of query tile i
    meets = valid[..., None] & (key_start < anchors[..., None]) & (key_end > lo[..., None])  # [b, nb, kt]
    partial = torch.einsum("qn,bnk->bqk", member.float(), meets.float()) > 0
    # own block keys [S + j*B, S + (j+1)*B): tiles meeting the blocks of query tile i
    block_first = context_len + torch.arange(num_blocks, device=device) * block_size
    own = (key_start[None] < block_first[:, None] + block_size) & (key_end[None] > block_first[:, None])  # [nb, kt]
    partial |= (member.float() @ own.float() > 0)[None]
    # full context tiles: inside [full_lo_j, a_j) for every block of the tile, none padding
    big = torch.iinfo(anchors.dtype).max
    tile_min_anchor = torch.where(member[None] & valid[:, None], anchors[:, None], big).amin(-1)
    tile_min_anchor = torch.where((member[None] & ~valid[:, None]).any(-1), -1, tile_min_anchor)  # [b, qt]
    tile_max_lo = torch.where(member[None], full_lo[:, None], -big).amax(-1)  # [b, qt]
    full = ((key_start >= tile_max_lo[..., None]) & (key_end <= tile_min_anchor[..., None])
            & (key_end <= context_len))
    partial &= ~full
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=TILE, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))
