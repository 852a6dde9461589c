"""One DFlash forward: target features -> blocks -> drafter -> chunked loss.

This is the objective of spec section 2 put together; the trainer, the benchmark
and the distributed drafter ranks all call it. Model files stay free of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from dflash_train.models.attention import build_masks
from dflash_train.objective.blocks import Blocks, build_blocks, default_gamma, predicting_states
from dflash_train.objective.config import ObjectiveConfig, check_loss_positions
from dflash_train.objective.kinds import terms_of
from dflash_train.objective.loss import LossOptions, LossOutput, dflash_loss
from dflash_train.objective.weighting import WEIGHTINGS


def unwrap(model):
    """The drafter module inside a DDP wrapper (``.module``), or the module itself."""
    return getattr(model, "module", model)


@dataclass
class ObjectiveOptions:
    """The objective of one training step: the ``objective:`` section as configured, plus what the
    step decides (the block, the mask token, the attention path, whether the loss is compiled)."""

    block_size: int
    mask_token_id: int
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    attention: str = "sdpa"  # "sdpa" (dense mask) or "flex" (block-sparse, GPU)
    compiled_loss: bool = False  # the loss chunks through torch.compile (the trainer's choice on CUDA)

    def __post_init__(self):
        self.objective.validate()
        check_loss_positions(self.objective.loss_positions, self.block_size)

    @property
    def gamma(self) -> float:
        return self.objective.gamma or default_gamma(self.block_size)

    @property
    def needs_target_distribution(self) -> bool:
        """The target's final hidden states are needed (a kl/tv target): it then runs all its layers."""
        return self.objective.needs_target_distribution

    def loss_options(self) -> LossOptions:
        o = self.objective
        targets = tuple((name, float(weight)) for name, weight in o.targets.items() if weight > 0)
        return LossOptions(o.chunk_size, targets, self.compiled_loss, block=self.last_position,
                           weighting=o.weighting, dpace_alpha=o.dpace_alpha)

    @property
    def last_position(self) -> int:
        """The last block position with a label: ``loss_positions``, or B - 1."""
        lp = self.objective.loss_positions
        return self.block_size - 1 if lp is None else lp

    def normalizer(self, blocks: Blocks) -> torch.Tensor:
        """This micro-batch's share of the step's divisor (``objective/weighting.py``)."""
        return WEIGHTINGS[self.objective.weighting].normalizer(blocks.weights, blocks.valid)

    def with_objective(self, **changes) -> ObjectiveOptions:
        """A copy with some ``objective`` keys changed (tests, ablations)."""
        return dataclasses.replace(self, objective=dataclasses.replace(self.objective, **changes))


def make_blocks(input_ids, loss_mask, anchors, keep, opts: ObjectiveOptions, doc_ids=None) -> Blocks:
    """``doc_ids``: packed micro-batches' per-token conversation ids (None: one per row)."""
    return build_blocks(input_ids, loss_mask, anchors, keep, opts.block_size, opts.mask_token_id, opts.gamma,
                        doc_ids, opts.last_position)


def drafter_loss(
    drafter,
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
    ``target_hidden`` [rows, s, h] (required when a target term reads the target's
    distribution): the target's final normed hidden states, whose next-token distributions
    the kl and tv terms compare with the drafter's. The drafter's kind adds its own terms
    (``objective/kinds/``), found by the kind's name.
    """
    if opts.needs_target_distribution and target_hidden is None:
        raise ValueError("objective.targets kl/tv need the target's final hidden states")
    core = unwrap(drafter)
    rows, seq = features.shape[:2]
    masks = build_masks(
        opts.attention, core.layer_types, blocks.anchors, blocks.keep, seq, opts.block_size, core.sliding_window,
        blocks.starts,
    )
    with torch.no_grad():
        block_embeds = embed(blocks.tokens)
    context_positions = blocks.context_positions
    if context_positions is None:
        context_positions = torch.arange(seq, device=features.device).expand(rows, seq)
    hidden = drafter(block_embeds, features, blocks.positions, context_positions, masks)
    soft = predicting_states(blocks, target_hidden) if opts.needs_target_distribution else None
    kind = core.kind.name
    anchor_ids = blocks.tokens.view(*blocks.labels.shape)[..., 0]
    return dflash_loss(hidden, lm_head, blocks.labels, blocks.weights, blocks.valid, opts.loss_options(), soft,
                       opts.last_position, terms_of(kind), drafter, anchor_ids, opts.objective.kind_options(kind))
