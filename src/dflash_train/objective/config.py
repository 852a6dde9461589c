"""The ``objective:`` section of a job config: what the drafter is trained to minimize.

One dataclass, validated once when the config loads, handed to the training step as it is (the
benchmark takes the same section). Its named choices live in their own registries:
``objective/weighting.py`` (``weighting``) and ``objective/targets.py`` (``targets``); the drafter
kind's own terms (``kind``) in ``objective/kinds/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash_train.objective.kinds import terms_of
from dflash_train.objective.targets import TARGETS
from dflash_train.objective.weighting import WEIGHTINGS


@dataclass
class ObjectiveConfig:
    # How block positions are weighted: decay (the paper's exp(-(k-1)/gamma)), reach (decay times the
    # drafter's chance of reaching the position) or dpace (D-PACE: weights from the drafter's confidence at
    # the block's positions); objective/weighting.py
    weighting: str = "decay"
    gamma: float | None = None  # the decay's scale (null: the paper's value for the block size: 7 at B = 16)
    dpace_alpha: float = 0.5  # D-PACE's floor on each position's acceptance factor, in [0, 1]
    # What each position is trained towards, and how much: ce (the label's cross-entropy), kl (forward KL
    # from the target's own next-token distribution) and tv (total variation to it); e.g. {ce: 0.1, tv: 0.9}.
    # kl and tv make the target run all its layers at every step (objective/targets.py).
    targets: dict[str, float] = field(default_factory=lambda: {"ce": 1.0})
    # Only block positions 1..K carry the loss (null: all B - 1, the paper's). A drafter that accepts ~2
    # tokens a step almost never reaches position 9 (SmolLM2: 13 of 2,037 verify steps accepted more than 8),
    # yet every position costs an lm_head product over the whole vocabulary; later positions still run
    # through the drafter's layers (the block attends to itself), they just get no label.
    loss_positions: int | None = None
    chunk_size: int = 4096  # positions per lm_head + loss chunk (full logits are never materialized)
    # The drafter kind's own terms' settings (objective/kinds/<kind>.py; the kinds' table below lists them).
    # A missing key takes the kind's default.
    kind: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the key: unknown names, weights and ranges."""
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"objective.weighting must be one of {list(WEIGHTINGS)}, got {self.weighting!r}")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"objective.gamma must be > 0 (null: the paper's), got {self.gamma}")
        if not 0 <= self.dpace_alpha <= 1:
            raise ValueError(f"objective.dpace_alpha must be in [0, 1], got {self.dpace_alpha}")
        self._validate_targets()
        lp = self.loss_positions
        if lp is not None and (not isinstance(lp, int) or isinstance(lp, bool) or lp < 1):
            raise ValueError(f"objective.loss_positions must be a positive integer or null (all), got {lp!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"objective.chunk_size must be a positive integer, got {self.chunk_size!r}")
        if not isinstance(self.kind, dict):
            raise ValueError(f"objective.kind must be a mapping of the kind's term settings, got {self.kind!r}")

    def _validate_targets(self) -> None:
        targets = self.targets
        if not isinstance(targets, dict) or not targets:
            raise ValueError(f"objective.targets must map target names to weights, e.g. {{ce: 1.0}}, got {targets!r}")
        unknown = sorted(set(targets) - set(TARGETS))
        if unknown:
            raise ValueError(f"objective.targets: unknown {unknown}; known: {list(TARGETS)}")
        for name, weight in targets.items():
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight >= 0:
                raise ValueError(f"objective.targets.{name} must be a weight >= 0, got {weight!r}")
        if not sum(targets.values()) > 0:
            raise ValueError("objective.targets: the weights sum to 0; give one target a positive weight")

    def validate_with(self, block_size: int, kind: str) -> None:
        """The keys that depend on the drafter: loss positions inside the block, the kind's settings."""
        check_loss_positions(self.loss_positions, block_size)
        terms_of(kind).check_options(self.kind)

    @property
    def needs_target_distribution(self) -> bool:
        """Whether a target term reads the target's next-token distribution (it then runs all its layers)."""
        return any(TARGETS[name].needs_target and weight > 0 for name, weight in self.targets.items())

    def kind_options(self, kind: str) -> dict:
        """The kind's term settings with its defaults filled in."""
        return {**terms_of(kind).options, **self.kind}


def check_loss_positions(loss_positions: int | None, block_size: int) -> None:
    """``objective.loss_positions`` against the block: 1..B-1 (position 0 is the anchor, with no label)."""
    if loss_positions is None:
        return
    if loss_positions < 1:
        raise ValueError(f"objective.loss_positions must be a positive integer or null (all), got {loss_positions}")
    if loss_positions > block_size - 1:
        raise ValueError(f"objective.loss_positions ({loss_positions}) must be at most drafter.block_size - 1 "
                         f"({block_size - 1}): block position 0 is the anchor and has no label")
