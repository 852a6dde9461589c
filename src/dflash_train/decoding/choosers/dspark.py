"""DSpark's chooser: the Markov head's chain (``models/kinds/dspark.markov_walk``)."""

from __future__ import annotations

import torch

from dflash_train.decoding.choosers import register_chooser
from dflash_train.decoding.core import Proposal, Sampling, sample
from dflash_train.models.kinds.dspark import markov_walk


@register_chooser("dspark")
class MarkovChooser:
    """Slot by slot from the anchor, each slot's logits biased by the token picked before it.
    Greedy: the argmax chain (pure tensor code: it runs inside the static engine's CUDA graph).
    Sampling: each slot drawn from its biased, warped distribution (temperature, then ``top_p``),
    returned as ``q`` so the rejection rule stays exact."""

    def __init__(self, drafter):
        self.markov = drafter.markov_head

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
                 sampling: Sampling) -> Proposal:
        anchor = anchor.reshape(1).to(logits.device)
        if sampling.greedy:
            path, _, _ = markov_walk(self.markov, logits[None], anchor)
            return Proposal(path[0])
        prev, tokens, q_rows = anchor, [], []
        for slot in range(logits.shape[0]):  # the walk with the sampler's own warp (top_p too)
            row = logits[slot : slot + 1].float() + self.markov.bias(self.markov.embed(prev))
            q = sampling.probs(row)
            prev = sample(q, sampling.generator)
            tokens.append(prev)
            q_rows.append(q[0])
        return Proposal(torch.cat(tokens), torch.stack(q_rows))
