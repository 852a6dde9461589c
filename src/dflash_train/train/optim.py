"""The optimizer (AdamW, or Muon for the weight matrices: ``optim.name``) over fp32 master weights,
and the paper's cosine schedule with warmup."""

from __future__ import annotations

import math

import torch

from dflash_train.config import OptimConfig
from dflash_train.train.muon import Muon, muon_param_groups


def build_optimizer(module: torch.nn.Module, cfg: OptimConfig, fused: bool = False) -> torch.optim.Optimizer:
    """The optimizer of ``module``'s parameters. AdamW: ``fused`` uses the single-kernel
    implementation (CUDA and CPU), which can skip a step on the device. Muon always can."""
    if cfg.name == "muon":
        return Muon(muon_param_groups(module), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                    momentum=cfg.momentum)
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(module.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                             **kwargs)


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` takes ``found_inf`` (a device scalar) and skips a bad step itself,
    with no host sync: the fused AdamW and Muon."""
    return bool(optimizer.defaults.get("fused")) or getattr(optimizer, "takes_found_inf", False)


def clip_gradients(optimizer: torch.optim.Optimizer, parameters, max_norm: float) -> torch.Tensor:
    """Clip the gradients' total norm to ``max_norm`` (0: no clip); returns the norm before it.

    The fused AdamW clips inside its own kernel: it divides each gradient by
    ``optimizer.grad_scale`` (a device scalar, the hook AMP's unscaling uses) as it reads it for
    the update, which saves ``clip_grad_norm_``'s extra read and write of every gradient (~1 ms
    of the reference bench's step, 1B fp32 gradients). The divisor is ``clip_grad_norm_``'s
    factor inverted, ``max((norm + 1e-6) / max_norm, 1)``; the gradients left after the step are
    the clipped ones either way."""
    if max_norm > 0 and isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults.get("fused"):
        norm = _whole(torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None]))
        optimizer.grad_scale = torch.clamp((norm.float() + 1e-6) / max_norm, min=1.0)
        return norm
    return _whole(torch.nn.utils.clip_grad_norm_(parameters, max_norm if max_norm > 0 else float("inf")))


def _whole(norm: torch.Tensor) -> torch.Tensor:
    """A norm over FSDP2-sharded gradients is a DTensor: its full value (a device collective)."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


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
