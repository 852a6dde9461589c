"""The analytic flex BlockMask against the brute-force dense mask (CPU; no flex kernel runs)."""

from __future__ import annotations

import pytest
import torch

from dflash_train.models.attention import dense_mask, full_block_mask_mod, sliding_block_mask_mod
from dflash_train.models.block_mask import TILE, dflash_block_mask


def _tiles(num: torch.Tensor, idx: torch.Tensor, kv_tiles: int) -> torch.Tensor:
    """[b, qt, kt] bool of the key tiles a BlockMask lists."""
    b, _, qt = num.shape
    out = torch.zeros(b, qt, kv_tiles, dtype=torch.bool)
    for bi in range(b):
        for qi in range(qt):
            out[bi, qi, idx[bi, 0, qi, : num[bi, 0, qi]].long()] = True
    return out


def effective_mask(block_mask, mask_mod, batch, q_len, kv_len) -> torch.Tensor:
    """What flex computes: full tiles all visible, partial tiles through mask_mod, others not."""
    kv_tiles = -(-kv_len // TILE)
    partial = _tiles(block_mask.kv_num_blocks, block_mask.kv_indices, kv_tiles)
    full = _tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, kv_tiles)
    assert not (partial & full).any()
    expand = lambda t: t.repeat_interleave(TILE, 1).repeat_interleave(TILE, 2)[:, :q_len, :kv_len]  # noqa: E731
    element = dense_mask(mask_mod, batch, q_len, kv_len, "cpu")[:, 0]
    return expand(full) | (expand(partial) & element)


def _case(seed, batch, context_len, num_blocks, block_size, packed):
    g = torch.Generator().manual_seed(seed)
    anchors = torch.stack([torch.randperm(context_len - 1, generator=g)[:num_blocks].sort().values
                           for _ in range(batch)])
    keep = torch.rand(batch, num_blocks, generator=g) > 0.15
    starts = None
    if packed:  # conversations begin at a few random cut points
        cuts = torch.stack([torch.randperm(context_len, generator=g)[:3].sort().values for _ in range(batch)])
        cuts[:, 0] = 0
        starts = torch.stack([cuts[b][torch.searchsorted(cuts[b], anchors[b], right=True) - 1]
                              for b in range(batch)])
    return anchors, keep, starts


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize(("context_len", "num_blocks", "block_size", "window"), [
    (700, 48, 16, None), (512, 32, 16, None), (300, 20, 10, None), (900, 64, 16, 200), (700, 30, 8, 64),
])
def test_block_mask_equals_dense_mask(context_len, num_blocks, block_size, window, packed):
    batch = 2
    anchors, keep, starts = _case(context_len + num_blocks, batch, context_len, num_blocks, block_size, packed)
    if window is None:
        mod = full_block_mask_mod(anchors, keep, context_len, block_size)
    else:
        mod = sliding_block_mask_mod(anchors, keep, context_len, block_size, window)
    if starts is not None:  # the packed lower bound, applied on top of the layer's own mask
        base = mod

        def mod(b, h, q, kv):
            return base(b, h, q, kv) & ((kv >= context_len) | (kv >= starts[b, q // block_size]))
    mask = dflash_block_mask(mod, anchors, keep, context_len, block_size, window, starts)
    for tensor in (mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices):
        assert tensor.is_contiguous()  # the CUDA kernels assume row-major layouts (wrong results otherwise)
    q_len, kv_len = num_blocks * block_size, context_len + num_blocks * block_size
    want = dense_mask(mod, batch, q_len, kv_len, "cpu")[:, 0]
    torch.testing.assert_close(effective_mask(mask, mod, batch, q_len, kv_len), want)


def test_block_mask_is_sparse_and_uses_full_tiles():
    """Not a dense mask in disguise: far fewer than all tiles are partial, and the context
    tiles wholly before every anchor of a query tile are full (no mask_mod work there)."""
    anchors = torch.tensor([[1000, 1010, 1020, 1030, 1040, 1050, 1060, 1070] * 4]).sort().values
    keep = torch.ones_like(anchors, dtype=torch.bool)
    mod = full_block_mask_mod(anchors, keep, 2048, 16)
    mask = dflash_block_mask(mod, anchors, keep, 2048, 16)
    assert int(mask.full_kv_num_blocks[0, 0, 0]) == 1000 // TILE  # context tiles 0..6 full
    total_tiles = (2048 + 32 * 16) // TILE
    assert int(mask.kv_num_blocks.max()) <= 4 < total_tiles
