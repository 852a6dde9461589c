"""Muon for the drafter's weight matrices, AdamW for its gains (``optim.name=muon``).

Why: the SmolLM2 runs are bounded by optimizer steps, not by data (README, "What limits tau"):
held-out tau rises with the log of the steps and twice the learning rate changes nothing. Muon
(Jordan et al., 2024; "Muon is scalable", Liu et al., 2025) takes more out of each step on
hidden-layer matrices: it replaces a matrix's momentum by the nearest semi-orthogonal matrix (all
singular values ~1), so an update moves every direction of the matrix by the same amount instead
of mostly the few directions with large gradients.

The update of a matrix ``W`` (``rows x cols``) with gradient ``G``:

    B <- B + (1 - mu) (G - B)                    momentum
    M  = G + mu (B - G)                          Nesterov's look-ahead
    O  = newton_schulz(M)                        ~ U V^T of M = U S V^T, 5 iterations
    W <- W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O

The factor ``0.2 sqrt(max(rows, cols))`` gives the update the RMS AdamW's has (~0.2 lr per entry;
Liu et al.), so ``optim.lr`` and the schedule mean what they mean for AdamW. The drafter's 1-D
parameters (RMSNorm gains) take AdamW. The drafter has no embedding or lm_head of its own (the
target's are frozen), so every 2-D parameter is a hidden matrix.

One optimizer object, so that the trainer, its CUDA graph and its checkpoints see one: each param
group carries ``muon: True/False``. Like the fused AdamW, it skips a step on the device when the
trainer sets ``found_inf`` (a 0/1 device scalar): the gradients are zeroed and every update is
scaled by ``1 - found_inf``, which leaves weights, moments and step counts bit for bit unchanged
with no host sync (``TrainStep._update``). It reads ``lr`` as a float or a device tensor (the
graphed step's). Matrices of one shape are orthogonalized together (one batched matmul per
iteration): 4 shapes for a Llama-shaped drafter. Whole matrices are needed: not with FSDP.
"""

from __future__ import annotations

import math

import torch

# The quintic iteration's coefficients (Jordan et al.): singular values in (0, 1] go to ~[0.7, 1.2]
# in 5 steps. Not the exact polar factor, which Muon does not need.
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)


def newton_schulz(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with ``m``'s singular vectors, for a batch
    ``[..., rows, cols]``. bfloat16 on CUDA (as Muon runs it), float32 elsewhere."""
    x = m.to(torch.bfloat16 if m.is_cuda else torch.float32)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    frobenius = x.float().square().sum((-2, -1), keepdim=True).sqrt()
    x = x / (frobenius + 1e-7).to(x.dtype)  # all singular values <= 1
    a, b, c = NEWTON_SCHULZ
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def update_scale(shape: torch.Size) -> float:
    """The factor that gives an orthogonalized update AdamW's RMS (see the module docstring)."""
    return 0.2 * math.sqrt(max(shape))


def muon_param_groups(module: torch.nn.Module) -> list[dict]:
    """The module's trainable matrices (Muon) and other parameters (AdamW), as param groups."""
    params = [p for p in module.parameters() if p.requires_grad]
    if any(hasattr(p, "device_mesh") for p in params):
        raise ValueError("optim.name=muon orthogonalizes whole matrices: it does not run on FSDP-sharded "
                         "parameters (train.fsdp_drafter); use optim.name=adamw or DDP")
    groups = [{"params": [p for p in params if p.ndim == 2], "muon": True},
              {"params": [p for p in params if p.ndim != 2], "muon": False}]
    return [g for g in groups if g["params"]]


class Muon(torch.optim.Optimizer):
    """Muon on the groups marked ``muon``, AdamW (decoupled weight decay) on the others."""

    takes_found_inf = True  # TrainStep._update: skip a bad step on the device

    def __init__(self, params, lr: float, betas=(0.9, 0.95), weight_decay: float = 0.0, momentum: float = 0.95,
                 ns_steps: int = 5, eps: float = 1e-8):
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, momentum=momentum,
                        ns_steps=ns_steps, eps=eps, muon=False)
        super().__init__(params, defaults)
        self.found_inf: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("Muon.step takes no closure")
        keep = None if self.found_inf is None else 1 - self.found_inf  # 0: skip this step
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._muon if group["muon"] else self._adamw)(group, params, keep)

    @staticmethod
    def _grad(p, keep):
        """The gradient, zeroed on a skipped step (its NaNs would survive any scaling by 0)."""
        return p.grad if keep is None else torch.where(keep > 0, p.grad, 0.0)

    def _muon(self, group, params, keep) -> None:
        mu, lr, decay = group["momentum"], group["lr"], group["weight_decay"]
        scaled_lr = lr if keep is None else lr * keep
        by_shape: dict[tuple, list] = {}
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grad, buf = self._grad(p, keep), state["momentum_buffer"]
            buf.lerp_(grad, 1 - mu if keep is None else (1 - mu) * keep)
            by_shape.setdefault(tuple(sorted(p.shape)), []).append((p, grad.lerp(buf, mu)))
        for pairs in by_shape.values():
            wide = [m if m.size(0) <= m.size(1) else m.mT for _, m in pairs]
            ortho = newton_schulz(torch.stack(wide), group["ns_steps"])
            for (p, m), o in zip(pairs, ortho.unbind(0)):
                o = o if m.size(0) <= m.size(1) else o.mT
                if decay:
                    p.mul_(1 - scaled_lr * decay)
                p.add_(o.to(p.dtype) * (-scaled_lr * update_scale(p.shape)))

    def _adamw(self, group, params, keep) -> None:
        (beta1, beta2), lr, decay, eps = group["betas"], group["lr"], group["weight_decay"], group["eps"]
        scaled_lr = lr if keep is None else lr * keep
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grad, m, v, step = self._grad(p, keep), state["exp_avg"], state["exp_avg_sq"], state["step"]
            step.add_(1 if keep is None else keep)
            m.lerp_(grad, 1 - beta1 if keep is None else (1 - beta1) * keep)
            v.lerp_(grad * grad, 1 - beta2 if keep is None else (1 - beta2) * keep)
            done = step.clamp(min=1)  # a skipped first step leaves 0: keep the corrections finite
            update = (m / (1 - beta1 ** done)) / ((v / (1 - beta2 ** done)).sqrt() + eps)
            if decay:
                p.mul_(1 - scaled_lr * decay)
            p.add_(update.to(p.dtype) * -scaled_lr)
