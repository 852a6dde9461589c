"""One DFlash forward: target features -> blocks -> drafter -> chunked loss.

This is the objective of spec section 2 put together; the trainer, the benchmark
and the distributed drafter ranks all call it. Model files stay free of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_train.models.attention import build_masks
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.objective.blocks import Blocks, build_blocks, check_loss_positions, predicting_states
from dflash_train.objective.loss import OUT_OF_TOPK, LossOptions, LossOutput, SelectorTargets, dflash_loss


@dataclass
class ObjectiveOptions:
    block_size: int
    mask_token_id: int
    gamma: float
    attention: str = "sdpa"  # "sdpa" (dense mask) or "flex" (block-sparse, GPU)
    loss_chunk_size: int = 4096
    distill: float = 0.0  # > 0: soft targets from the target's own next-token distribution (train.distill)
    compiled_loss: bool = False  # the loss chunks through torch.compile (the trainer's choice on CUDA)
    # Block positions 1..loss_positions carry the loss (train.loss_positions; None: all B - 1). The later
    # ones still run through the drafter (the block attends to itself) but skip the lm_head entirely.
    loss_positions: int | None = None
    # Each position's weight times the drafter's detached probability of reaching it in verification
    # (train.reach_weighting; objective/loss._reach).
    reach_weighting: bool = False
    # "ce" or "dpace" (train.objective): D-PACE's weights replace the decay (objective/loss._dpace)
    objective: str = "ce"
    dpace_alpha: float = 0.5
    # DFlash2's selector CE where the label is not among the top-k (train.selector_out_of_topk)
    selector_out_of_topk: str = OUT_OF_TOPK[0]

    def __post_init__(self):
        check_loss_positions(self.loss_positions, self.block_size)
        self.loss_options()  # validates the combination (weighting, distill, alpha)

    def loss_options(self) -> LossOptions:
        """The chunked loss's options: D-PACE, reach or plain decay weighting."""
        if self.objective not in ("ce", "dpace"):
            raise ValueError(f"train.objective must be 'ce' or 'dpace', got {self.objective!r}")
        if self.objective == "dpace" and self.reach_weighting:
            raise ValueError("train.objective=dpace does not combine with train.reach_weighting")
        weighting = "dpace" if self.objective == "dpace" else ("reach" if self.reach_weighting else "decay")
        return LossOptions(self.loss_chunk_size, self.distill, self.compiled_loss, block=self.block_size - 1,
                           weighting=weighting, dpace_alpha=self.dpace_alpha)

    @property
    def last_position(self) -> int:
        """The last block position with a label: ``loss_positions``, or B - 1."""
        return self.block_size - 1 if self.loss_positions is None else self.loss_positions


def make_blocks(input_ids, loss_mask, anchors, keep, opts: ObjectiveOptions, doc_ids=None) -> Blocks:
    """``doc_ids``: packed micro-batches' per-token conversation ids (None: one per row)."""
    return build_blocks(input_ids, loss_mask, anchors, keep, opts.block_size, opts.mask_token_id, opts.gamma,
                        doc_ids, opts.last_position)


def drafter_loss(
    drafter: DFlashDrafter,
    embed: torch.nn.Module,
    lm_head: torch.Tensor,
    features: torch.Tensor,
    blocks: Blocks,
    opts: ObjectiveOptions,
    target_hidden: torch.Tensor | None = None,
) -> LossOutput:
    """Drafter forward over all blocks of a micro-batch and its loss pieces.

    ``features`` [rows, s, n*h] are the target's context features (no grad). The
    masks are built here, once per micro-batch, and shared by all layers.
    ``target_hidden`` [rows, s, h] (required when ``opts.distill`` > 0): the target's
    final normed hidden states, whose next-token distributions become soft targets.
    """
    if opts.distill > 0 and target_hidden is None:
        raise ValueError("distillation (train.distill > 0) needs the target's final hidden states")
    rows, seq = features.shape[:2]
    masks = build_masks(
        opts.attention, drafter.layer_types, blocks.anchors, blocks.keep, seq, opts.block_size, drafter.sliding_window,
        blocks.starts,
    )
    with torch.no_grad():
        block_embeds = embed(blocks.tokens)
    context_positions = blocks.context_positions
    if context_positions is None:
        context_positions = torch.arange(seq, device=features.device).expand(rows, seq)
    hidden = drafter(block_embeds, features, blocks.positions, context_positions, masks)
    soft = predicting_states(blocks, target_hidden) if opts.distill > 0 else None
    selector = getattr(drafter, "candidate_selector", None)  # DFlash2 (through a DDP wrapper: .module)
    if selector is None and hasattr(drafter, "module"):
        selector = getattr(drafter.module, "candidate_selector", None)
    targets = None
    if selector is not None:
        anchor_ids = blocks.tokens.view(*blocks.labels.shape)[..., 0]
        targets = SelectorTargets(selector, anchor_ids, opts.selector_out_of_topk)
    return dflash_loss(hidden, lm_head, blocks.labels, blocks.weights, blocks.valid, opts.loss_options(), soft,
                       opts.last_position, targets)
