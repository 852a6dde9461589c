"""AdamW over fp32 master weights and the paper's cosine schedule with warmup."""

from __future__ import annotations

import math

import torch

from dflash_train.config import OptimConfig


def build_optimizer(params, cfg: OptimConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW; ``fused`` uses the single-kernel CUDA implementation."""
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, **kwargs)


def cosine_with_warmup(step: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warmup to 1, then cosine down to ``min_ratio`` at the end."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer, cfg: OptimConfig, total_steps: int,
                    time_fraction=None) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine with warmup over ``total_steps``. ``time_fraction()`` (a training-time budget's
    spent fraction) moves the schedule on as if ``fraction * total_steps`` steps were done,
    when that is further than the real step count."""
    warmup = int(round(cfg.warmup_ratio * total_steps))

    def multiplier(step: int) -> float:
        if time_fraction is not None:
            step = max(step, time_fraction() * total_steps)
        return cosine_with_warmup(step, total_steps, warmup, cfg.min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
