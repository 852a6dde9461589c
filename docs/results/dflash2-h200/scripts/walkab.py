"""bench-decode with the previous (slot-by-slot) selector walk patched in: the A/B of the walk."""
import sys

import torch

import dflash_train.models.drafter as drafter_mod
from dflash_train.bench import decode_steps


def slot_by_slot_walk(selector, hidden, logits, anchor_ids, temperature=0.0, generator=None):
    unary, candidates = torch.topk(logits.float(), selector.top_k, dim=-1)
    projected = selector.hidden_projection(hidden)
    predecessor, path = anchor_ids, []
    for slot in range(hidden.shape[1]):
        s = selector.scores(projected[:, slot], unary[:, slot], candidates[:, slot], predecessor)
        index = s.argmax(dim=-1)
        predecessor = candidates[:, slot].gather(-1, index[:, None])[:, 0]
        path.append(predecessor)
    return torch.stack(path, dim=1), candidates, None


drafter_mod.selector_walk = slot_by_slot_walk
decode_steps.main(sys.argv[1:])
