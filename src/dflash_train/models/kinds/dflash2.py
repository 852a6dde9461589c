"""DFlash2: the DFlash backbone plus dynamic convolutions and a candidate selector (docs/spec.md
section 2b). Its network, shipped after ``models/drafter.py`` in a DFlash2 export (the import
line below is dropped there: both files then form one module); training terms in
``objective/kinds/dflash2.py``, the decoder's chooser in ``decoding/choosers/dflash2.py``.

Every layer gets two grouped dynamic causal convolutions, ``attention_conv`` and ``mlp_conv``
(:class:`GroupedDynamicCausalConv`), and the drafter a ``candidate_selector``
(:class:`CandidateSelector`) that rescores each slot's top-k candidates along a path
(:func:`selector_walk`). Identity initialization makes an untrained DFlash2 compute what DFlash
computes. Options (the authors' defaults): ``conv_kernel_size`` 2, ``conv_group_size`` 16,
``selector_rank`` 256, ``selector_top_k`` 16; served as ``DFlash2DraftModel`` with them in
``dflash_config``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash_train.models.drafter import DrafterKind, KindModule, _cfg, register_kind  # backbone


def grouped_causal_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, segment: int) -> torch.Tensor:
    """``y[t] = sum_o (base[o] + delta[t, o, group]) * x[t - o]``, inside segments of ``segment`` slots.

    ``x`` [b, q, h]; ``delta`` [b, q, K, g] (one dynamic coefficient per tap and group of
    h/g channels, computed from the token at t); ``base`` [K, h] static taps. The q slots are
    q/segment independent blocks: a tap never reads across a block boundary, so slot 0 of
    every block reads zeros for o >= 1 (each block is drafted on its own at inference, where
    nothing precedes its anchor slot). With base = [1, 0, ...] and delta = 0 this is exactly
    the identity, which is why an untrained DFlash2 equals DFlash.
    """
    b, q, h = x.shape
    taps, groups = delta.shape[-2], delta.shape[-1]
    blocks = x.view(b, q // segment, segment, groups, h // groups)
    delta = delta.view(b, q // segment, segment, taps, groups, 1)
    out = torch.zeros_like(blocks)
    for o in range(taps):
        shifted = blocks if o == 0 else F.pad(blocks[:, :, :-o], (0, 0, 0, 0, o, 0))
        out = out + base[o].view(groups, h // groups).to(x.dtype) * shifted
        out = torch.addcmul(out, delta[:, :, :, o], shifted)
    return out.view(b, q, h)


class GroupedDynamicCausalConv(KindModule):
    """Two causal convolutions around one sublayer: ``prepare`` on its normed input, ``finish`` on
    its output (before the residual add). Both dynamic parts come from the sublayer's input.

    ``base_kernel`` [2, K, h] (prepare, finish); ``kernel_projection`` h -> 2 * K * groups, the
    authors' names and shapes. Identity at initialization: tap 0 = 1, the others 0, projection 0.
    """

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.groups = kernel_size, hidden // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor, segment: int) -> tuple[torch.Tensor, torch.Tensor]:
        delta = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return grouped_causal_conv(x, delta[..., 0, :, :], self.base_kernel[0], segment), delta[..., 1, :, :]

    def finish(self, x: torch.Tensor, delta: torch.Tensor, segment: int) -> torch.Tensor:
        return grouped_causal_conv(x, delta, self.base_kernel[1], segment)


class CandidateSelector(KindModule):
    """Scores a slot's top-k candidates given the token before it:
    ``S(a, b) = U(b) + <A[a] * P h, B[b]>`` with U the drafter's logit of b, A/B rank-r
    codebooks (``predecessor_codebook``/``successor_codebook``), P ``hidden_projection``.
    B starts at zero, so an untrained selector ranks by the logits alone (DFlash's argmax)."""

    def __init__(self, config):
        super().__init__()
        rank, vocab = int(DFLASH2.option(config, "selector_rank")), _cfg(config, "vocab_size")
        self.top_k = int(DFLASH2.option(config, "selector_top_k"))
        # Plain [vocab, r] parameters, not nn.Embedding: the served tensors are named
        # ``candidate_selector.{predecessor,successor}_codebook`` with no ``.weight`` (the authors').
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.hidden_projection = nn.Linear(_cfg(config, "hidden_size"), rank, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            nn.init.normal_(self.predecessor_codebook, std=1.0)
            self.successor_codebook.zero_()

    def scores(self, projected, unary, candidates, predecessors) -> torch.Tensor:
        """``projected`` [..., r] = P h, ``unary``/``candidates`` [..., k], ``predecessors`` [...]: S [..., k]."""
        pair = F.embedding(predecessors, self.predecessor_codebook) * projected
        succ = F.embedding(candidates, self.successor_codebook)
        return unary + (succ * pair.unsqueeze(-2).to(succ.dtype)).sum(-1).to(unary.dtype)


def selector_transitions(selector: CandidateSelector, hidden, logits, anchor_ids):
    """Every score the walk can visit, in one batched product instead of one small product per slot.

    Slot j's predecessor is one of slot j - 1's k candidates (slot 0's is the anchor), so the
    walk only ever reads ``T[:, j, a, c]`` = S(candidate a of slot j - 1 -> candidate c of slot j):
    k x k scores per slot, [b, P, k, k] in all (15 x 16 x 16 for B = 16). Computing them up front
    leaves the walk itself a chain of tiny index lookups instead of each slot's own gathers and
    products: the recipe-shaped draft step replayed in its CUDA graph on an H200 went from 0.764 to
    0.691 ms (DFlash's: 0.535; docs/results/dflash2-h200/draft-step). The product is a matmul over
    the rank rather than ``CandidateSelector.scores``' broadcast sum, which for all k predecessors
    would materialize [b, P, k, k, r]: the same S up to rounding (tests: the slow-loop walks).
    Slot 0's k rows are all the anchor's. Returns ``(T float32, candidates [b, P, k])``."""
    unary, candidates = torch.topk(logits.float(), selector.top_k, dim=-1)
    projected = selector.hidden_projection(hidden)  # [b, P, r]
    anchors = anchor_ids.reshape(-1, 1, 1).expand(-1, 1, selector.top_k)
    before = torch.cat([anchors, candidates[:, :-1]], dim=1)  # [b, P, k]: each slot's possible predecessors
    pair = F.embedding(before, selector.predecessor_codebook) * projected.unsqueeze(-2)  # [b, P, k, r]
    succ = F.embedding(candidates, selector.successor_codebook)  # [b, P, k, r]
    pairwise = pair.to(succ.dtype) @ succ.transpose(-1, -2)  # [b, P, k (before), k (candidate)]
    return unary.unsqueeze(-2) + pairwise.float(), candidates


def selector_walk(selector: CandidateSelector, hidden, logits, anchor_ids, temperature: float = 0.0, generator=None):
    """The DFlash2 draft path: a sequential walk over each slot's top-k candidates.

    ``hidden`` [b, P, h] final-normed states of the P draft slots (the anchor slot excluded),
    ``logits`` [b, P, vocab] their logits, ``anchor_ids`` [b] the verified token before slot 1.
    Slot j's predecessor is the token the walk chose at slot j - 1. Greedy (temperature 0)
    takes argmax S; otherwise a draw from softmax(S / T), whose row q (over the k candidates)
    the rejection sampler needs. Returns ``(path [b, P], candidates [b, P, k], q [b, P, k] or None)``.
    The scores come from :func:`selector_transitions`; greedy then needs only each (slot,
    predecessor)'s best successor and P lookups along the chain.
    """
    scores, candidates = selector_transitions(selector, hidden, logits, anchor_ids)
    rows, slots, k = scores.shape[0], scores.shape[1], scores.shape[-1]
    if temperature > 0:
        index, picks, q_rows = torch.zeros(rows, dtype=torch.long, device=scores.device), [], []
        for slot in range(slots):
            s = scores[:, slot].gather(1, index.view(-1, 1, 1).expand(-1, 1, k))[:, 0]  # the row after the pick
            q = torch.softmax(s / temperature, dim=-1)
            index = torch.multinomial(q, 1, generator=generator)[:, 0]
            picks.append(index)
            q_rows.append(q)
        q_out = torch.stack(q_rows, dim=1)
    else:
        best_next = scores.argmax(dim=-1)  # [b, P, k]: the best candidate after each possible predecessor
        picks = [best_next[:, 0, 0]]
        for slot in range(1, slots):
            picks.append(best_next[:, slot].gather(-1, picks[-1][:, None])[:, 0])
        q_out = None
    path = candidates.gather(-1, torch.stack(picks, dim=1).unsqueeze(-1))[..., 0]
    return path, candidates, q_out


class DFlash2Kind(DrafterKind):
    name = "dflash2"
    architecture = "DFlash2DraftModel"
    options = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}

    def _conv(self, config) -> GroupedDynamicCausalConv:
        return GroupedDynamicCausalConv(int(_cfg(config, "hidden_size")), int(self.option(config, "conv_kernel_size")),
                                        int(self.option(config, "conv_group_size")))

    def around_attention(self, config):
        return "attention_conv", self._conv(config)

    def around_mlp(self, config):
        return "mlp_conv", self._conv(config)

    def heads(self, config):
        return {"candidate_selector": CandidateSelector(config)}

    def greedy_draft(self, drafter, hidden, logits, anchor_ids):
        """The selector's greedy walk from the anchor (the path, not each slot's argmax)."""
        return selector_walk(drafter.candidate_selector, hidden, logits, anchor_ids)[0]

    def serving_fields(self, config):
        """The authors' format: the four shape keys inside ``dflash_config``."""
        return {"dflash_config": {k: int(self.option(config, k)) for k in self.options}}

    def check_options(self, options, config):
        super().check_options(options, config)
        values = {**self.options, **options}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"drafter.options.{key} must be a positive integer, got {value!r}")
        block, hidden, vocab = (getattr(config, k, None) for k in ("block_size", "hidden_size", "vocab_size"))
        if block is not None and values["conv_kernel_size"] > block:
            raise ValueError(f"drafter.options.conv_kernel_size {values['conv_kernel_size']} exceeds block_size {block}")
        if hidden is not None and hidden % values["conv_group_size"]:
            raise ValueError(f"drafter.options.conv_group_size {values['conv_group_size']} must divide hidden_size {hidden}")
        if vocab is not None and values["selector_top_k"] > vocab:
            raise ValueError(f"drafter.options.selector_top_k {values['selector_top_k']} exceeds the vocabulary ({vocab})")


DFLASH2 = register_kind(DFlash2Kind())
