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


def load_eval_inputs(target_path, drafter_path, prompts: str, limit: int | None, device: str, dtype: torch.dtype):
    """``(target, drafter, prompt ids)`` for an evaluation: the prompts are read first (a bad
    file fails before any model loads), then the target, the drafter checked against it,
    and the prompts encoded with the target's chat template."""
    from dflash_train.data.prompt_sets import resolve_prompts
    from dflash_train.data.prompts import encode_prompts, read_prompts
    from dflash_train.models.target import Target

    texts = read_prompts(resolve_prompts(prompts), limit=limit)
    target = Target.load(target_path, dtype=dtype, device=device)
    drafter = load_drafter_folder(drafter_path, target)
    if target.tokenizer is None:
        raise ValueError(f"target {target_path} has no tokenizer")
    return target, drafter, encode_prompts(target.tokenizer, texts)
