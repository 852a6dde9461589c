"""The DFlash drafter as a proposer, and the one DFlash block forward every engine runs.

A DFlash block anchored at position ``p`` is ``[anchor, MASK x n]`` at positions
``p .. p+n``; the drafter attends over the target's context features of positions ``< p``
(cached per layer as K/V in :class:`~.cache.DrafterContextCache`: appended in the reference
loop, at fixed slots in the static engine) and over the block itself. Its states at block slots
``1 .. n``, through the target's lm_head, are the draft logits. :func:`block_hidden` and
:func:`block_logits` are that forward, shared by :class:`DFlashProposer` (the reference
loop and replay), the static engine's graphed draft step and replay's all-blocks forward.

How the slots' tokens are chosen from those states is the drafter's
:func:`~.core.block_chooser` (DFlash: each slot's argmax or sample).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_train.models.attention import decode_masks

from .cache import DrafterContextCache
from .core import BlockProposer, FromLogits, LogitsProposer, Proposal, Sampling, block_chooser


def drafter_setting(config, name: str, default=None):
    """A drafter config value, from the config itself or its serving ``dflash_config``."""
    value = getattr(config, name, None)
    if value is None:
        value = (getattr(config, "dflash_config", None) or {}).get(name, default)
    return default if value is None else value


def block_hidden(target, drafter, block_ids: torch.Tensor, features: torch.Tensor, block_pos: torch.Tensor,
                 ctx_pos: torch.Tensor, masks: dict, cache=None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The drafter's states [1, rows, H] for ``block_ids`` [1, rows] (anchor + mask tokens; several
    blocks side by side when ``masks`` say so) over context ``features`` [1, m, n*h]."""
    dtype = dtype or next(drafter.parameters()).dtype
    return drafter(target.embed(block_ids).to(dtype), features.to(dtype), block_pos, ctx_pos, masks=masks, cache=cache)


def block_logits(target, hidden: torch.Tensor) -> torch.Tensor:
    """Float draft logits of drafter states ``hidden`` [..., H] through the target's lm_head."""
    weight = target.lm_head_weight
    return F.linear(hidden.to(weight.dtype), weight).float()


class DFlashProposer:
    """A :class:`DFlashDrafter` plus the target's frozen embedding and lm_head, as a
    :class:`~.core.BlockProposer` (``propose_block``) and a :class:`~.core.LogitsProposer`
    (``propose``: the block's draft logits)."""

    def __init__(self, target, drafter) -> None:
        self.target = target
        self.drafter = drafter
        cfg = drafter.config
        self.feature_layer_ids = list(drafter_setting(cfg, "target_layer_ids"))
        self.mask_token_id = int(drafter_setting(cfg, "mask_token_id"))
        self.block_size = int(drafter.block_size)
        self.choose = block_chooser(drafter)
        self.cache = DrafterContextCache()

    def reset(self) -> None:
        self.cache.reset()

    @torch.no_grad()
    def hidden(self, tokens: list[int], new_features: torch.Tensor | None, num_draft: int) -> torch.Tensor:
        """The drafter's states [num_draft + 1, H] of the block anchored at ``tokens[-1]``."""
        if new_features is None:
            raise ValueError("DFlashProposer needs target features")
        p, m = len(tokens) - 1, new_features.shape[1]
        if len(self.cache) + m != p:
            raise RuntimeError(f"drafter cache holds {len(self.cache)} positions + {m} new != position {p}")
        device = self.target.device
        block_ids = torch.full((1, num_draft + 1), self.mask_token_id, dtype=torch.long, device=device)
        block_ids[0, 0] = tokens[-1]
        block_pos = torch.arange(p, p + num_draft + 1, device=device).unsqueeze(0)
        ctx_pos = torch.arange(p - m, p, device=device).unsqueeze(0)
        masks = decode_masks(self.drafter.layer_types, p, p, num_draft + 1, self.drafter.sliding_window, device)
        return block_hidden(self.target, self.drafter, block_ids, new_features, block_pos, ctx_pos, masks,
                            self.cache)[0]

    @torch.no_grad()
    def propose(self, tokens: list[int], new_features: torch.Tensor | None, num_draft: int) -> torch.Tensor:
        return block_logits(self.target, self.hidden(tokens, new_features, num_draft)[1:])

    @torch.no_grad()
    def propose_block(self, tokens: list[int], new_features: torch.Tensor | None, num_draft: int,
                      sampling: Sampling) -> Proposal:
        hidden = self.hidden(tokens, new_features, num_draft)[1:]
        anchor = torch.tensor([tokens[-1]], device=hidden.device)
        return self.choose(hidden, block_logits(self.target, hidden), anchor, sampling)


def as_proposer(target, drafter) -> BlockProposer:
    """What the loops draft with: a drafter module becomes a :class:`DFlashProposer`; a
    :class:`~.core.BlockProposer` is used as is; a :class:`~.core.LogitsProposer` is wrapped."""
    if isinstance(drafter, torch.nn.Module):
        return DFlashProposer(target, drafter)
    if isinstance(drafter, BlockProposer):
        return drafter
    if isinstance(drafter, LogitsProposer):
        return FromLogits(drafter)
    raise TypeError(f"not a drafter or proposer: {type(drafter).__name__} (needs propose_block or propose)")
