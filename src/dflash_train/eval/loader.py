"""Load a DFlash serving-format folder (spec section 4) for evaluation.

The format is read in one place, ``dflash_train.export.serving`` (import of ours or of
a published drafter with the same layout, strict tensor names, every mismatch with
the target named); this module only places the drafter where the target lives.
"""

from __future__ import annotations

import os

import torch

from dflash_train.export.serving import load_drafter_folder as load_serving_folder
from dflash_train.models.drafter import DFlashDrafter


def load_drafter_folder(path: str | os.PathLike, target, dtype: torch.dtype | None = None,
                        device=None) -> DFlashDrafter:
    """The drafter of ``path`` checked against ``target``, on the target's device and
    in its dtype unless told otherwise, frozen, in eval mode."""
    weight = target.lm_head_weight
    drafter, _ = load_serving_folder(path, target, device=device or weight.device, dtype=dtype or weight.dtype)
    return drafter.eval().requires_grad_(False)
