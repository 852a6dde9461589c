"""DFlash2's chooser: the candidate selector's walk (``models/kinds/dflash2.selector_walk``)."""

from __future__ import annotations

import torch

from dflash_train.decoding.choosers import register_chooser
from dflash_train.decoding.core import Proposal, Sampling
from dflash_train.models.kinds.dflash2 import selector_walk


@register_chooser("dflash2")
class SelectorChooser:
    """The sequential walk over each slot's top-k candidates scored by the drafter's
    ``candidate_selector``, starting from the anchor. Greedy takes the argmax of the scores (pure
    tensor code: it runs inside the static engine's CUDA graph); sampling draws from softmax(S / T)
    over the k candidates and returns that distribution as ``q`` (zero outside the candidates), so
    the rejection rule stays exact. ``top_p`` does not apply to the walk: its support is already
    the k candidates."""

    def __init__(self, drafter):
        self.selector = getattr(drafter, "candidate_selector", drafter)

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
                 sampling: Sampling) -> Proposal:
        anchor = anchor.reshape(1).to(logits.device)
        hidden = hidden.to(self.selector.hidden_projection.weight.dtype)
        if sampling.greedy:
            path, _, _ = selector_walk(self.selector, hidden[None], logits[None], anchor)
            return Proposal(path[0])
        path, candidates, q = selector_walk(self.selector, hidden[None], logits[None], anchor,
                                            sampling.temperature, sampling.generator)
        full = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return Proposal(path[0], full.scatter_(-1, candidates[0], q[0].float()))
