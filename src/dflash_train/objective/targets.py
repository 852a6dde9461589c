"""What each position's drafted distribution is trained towards (``objective.targets``), by name.

The loss at one position is a weighted sum of these terms (weights from the config, e.g.
``{ce: 1}``, the paper's, or ``{ce: 0.1, tv: 0.9}``); each is computed from one chunk
of the drafter's logits ``z`` [n, V] (float32) with their log-normalizer ``lse``, together with
its gradient with respect to ``z``, so that the chunked loss never keeps more than a chunk of
logits and never runs the lm_head again in backward:

- ``ce``: cross-entropy of the label: ``lse - z_y``; gradient ``q - onehot(y)`` (q = softmax z).
- ``kl``: forward KL from the target's own next-token distribution p to the drafter's:
  ``sum p (log p - log q)``; gradient ``q - p``. (``ce`` toward soft targets
  ``(1 - d) onehot + d p`` has the gradient of ``{ce: 1 - d, kl: d}``.)
- ``tv``: total variation ``0.5 sum |p - q|``, which bounds the chance that a sampled draft is
  rejected; gradient ``0.5 q (s - <s, q>)`` with ``s = sign(q - p)``.

p is the softmax of the target's logits at the position that predicts the label (the target
then runs all its layers; ``predicting_states``). A new target is an entry in :data:`TARGETS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def _ce(logits, lse, labels, p, want_grad):
    loss = lse - logits.gather(1, labels.unsqueeze(1)).squeeze(1)
    if not want_grad:
        return loss, None
    # softmax - onehot as one pointwise expression (a scatter would make Inductor store the softmax)
    is_label = torch.arange(logits.shape[1], device=logits.device) == labels.unsqueeze(1)
    return loss, torch.exp(logits - lse.unsqueeze(1)) - is_label.to(logits.dtype)


def _kl(logits, lse, labels, p, want_grad):
    log_q = logits - lse.unsqueeze(1)
    loss = (p * (torch.log(p.clamp_min(1e-30)) - log_q)).sum(-1)
    return loss, (torch.exp(log_q) - p) if want_grad else None


def _tv(logits, lse, labels, p, want_grad):
    q = torch.exp(logits - lse.unsqueeze(1))
    loss = 0.5 * (p - q).abs().sum(-1)
    if not want_grad:
        return loss, None
    s = torch.sign(q - p)
    return loss, 0.5 * q * (s - (s * q).sum(-1, keepdim=True))


@dataclass(frozen=True)
class Target:
    """One entry: ``fn(logits, lse, labels, p, want_grad) -> (loss per row, d loss / d logits or None)``;
    ``needs_target``: it reads the target's distribution p."""

    name: str
    fn: Callable
    needs_target: bool


TARGETS = {t.name: t for t in (Target("ce", _ce, False), Target("kl", _kl, True), Target("tv", _tv, True))}
