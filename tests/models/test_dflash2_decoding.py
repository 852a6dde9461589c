"""Greedy speculative decoding with a DFlash2 drafter in the reference engine equals plain greedy.

The engines take draft *logits* from a proposer and draft their argmax; until the DFlash2
proposer is wired into them (after the decoding rebuild merges), this test adapts the current
``DFlashProposer``: its logits go through ``selector_walk`` and come back one-hot on the path.
"""

from __future__ import annotations

import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.decoding.speculative import DFlashProposer, speculative_generate, target_generate
from dflash_train.models.drafter import selector_walk
from dflash_train.models.target import Target


class _WalkProposer(DFlashProposer):
    """Drafts the greedy selector path (recorded, with how often it left the argmax)."""

    def __init__(self, target, drafter):
        super().__init__(target, drafter)
        self.paths, self.off_argmax = [], 0

    @torch.no_grad()
    def propose(self, tokens, new_features, num_draft):
        states = {}
        handle = self.drafter.register_forward_hook(lambda m, a, out: states.setdefault("h", out))
        try:
            logits = super().propose(tokens, new_features, num_draft)
        finally:
            handle.remove()
        hidden = states["h"][:, 1:]
        path = selector_walk(self.drafter.candidate_selector, hidden, logits[None], torch.tensor([tokens[-1]]))[0][0]
        self.off_argmax += int((path != logits.argmax(-1)).sum())
        self.paths.append(path)
        return torch.nn.functional.one_hot(path, logits.shape[-1]).float()


def test_greedy_dflash2_speculative_equals_plain_greedy():
    target = Target(tiny_qwen3(num_layers=4))
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=4, target_layer_ids=[0, 2], kind="dflash2",
                              conv_group_size=16, selector_rank=8, selector_top_k=5)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "candidate_selector" in name or "conv" in name:
                p.normal_(std=0.5)
    drafter.eval()
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        prompt = torch.randint(0, 120, (1, 7), generator=g)
        proposer = _WalkProposer(target, drafter)
        spec = speculative_generate(target, proposer, prompt, max_new_tokens=20)
        plain = target_generate(target, prompt, max_new_tokens=20)
        assert spec.tokens == plain.tokens
    assert proposer.off_argmax > 0  # the selector really chose other tokens than DFlash's argmax
