"""The reference loops: DFlash speculative decoding (greedy and sampling) and plain target
decoding over a Hugging Face cache.

The loop follows the authors' reference decoder:

* prefill: the target runs over the prompt with a KV cache; its argmax (or sample) at
  the last position is the first token, and its hidden states at ``target_layer_ids``
  are the drafter's first context features;
* each step: block ``[last committed token, MASK x (B-1)]`` at positions ``p .. p+B-1``
  (``p`` = tokens the target has processed). The drafter sees the context features
  of every position ``< p`` (cached as per-layer K/V; only new positions are passed)
  and proposes ``d_1 .. d_{B-1}`` from block positions ``1 .. B-1``;
* the target verifies ``[last, d_1 .. d_{B-1}]`` in one forward; the accepted prefix
  plus one bonus token is committed; the target's KV cache is cropped to the verified
  positions and their features become the drafter's next new context.

``tau`` of a verify step = accepted drafts + 1. Proposals, acceptance, committing and the
loops themselves (:func:`~.core.speculative_loop`, :func:`~.core.plain_loop`) are the shared
:mod:`.core`; this module gives them the HF cache's steps (:class:`_HFSteps`, :class:`_HFPlainSteps`); anything with its ``BlockProposer`` (or ``LogitsProposer``)
interface can stand in for the drafter (tests plug in oracles).
"""

from __future__ import annotations

import torch

from dflash_train.hf_compat import cache_kwarg

from .cache import DrafterContextCache
from .core import (
    GenResult,
    HostClock,
    Proposal,
    Sampling,
    SpecResult,
    accept,
    choose_next,
    greedy_accept,
    next_token,
    plain_loop,
    speculative_accept,
    speculative_loop,
    warp,
)
from .proposers import DFlashProposer, as_proposer

__all__ = [  # the loops, and the core names this module has always offered
    "DFlashProposer", "DrafterContextCache", "GenResult", "SpecResult", "as_proposer", "crop_cache",
    "greedy_accept", "speculative_accept", "speculative_generate", "target_generate", "warp",
]


def _out_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def crop_cache(cache, length: int) -> None:
    """Shrink a HF cache to its first ``length`` positions (negative ``crop`` works in
    every transformers version: "remove that many"; a positive value does not)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def _target_forward(target, layer_ids: list[int], input_ids: torch.Tensor, cache):
    """Returns (logits [s, V] float, cache, features or None)."""
    kwargs = {"input_ids": input_ids, "use_cache": True, cache_kwarg(target.model): cache}
    if layer_ids:
        out, feats = target.forward_with_features(layer_ids, **kwargs)
    else:
        with torch.no_grad():
            out, feats = target.model(**kwargs), None
    return out.logits[0].float(), _out_cache(out), feats


def _check_single(input_ids: torch.Tensor) -> None:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [1, s], got {tuple(input_ids.shape)}")


class _HFSteps:
    """The reference loop's engine steps (:class:`~.core.SpecSteps`) over a HF cache: the
    proposer drafts from the committed tokens and the new verified features; the target
    verifies ``[anchor, drafts]`` in one forward and accepts (greedy or the rejection rule);
    keeping a prefix crops the cache to the verified positions."""

    def __init__(self, target, proposer, num_draft: int, sampling: Sampling) -> None:
        self.target, self.proposer, self.num_draft, self.sampling = target, proposer, num_draft, sampling
        self.layer_ids, self.device = list(proposer.feature_layer_ids), target.device
        self.cache = self.features = self.step_features = None
        self.tokens: list[int] = []
        self.prompt_len = self.p = 0

    def prefill(self, input_ids: torch.Tensor) -> int:
        self.proposer.reset()
        logits, self.cache, self.features = _target_forward(self.target, self.layer_ids, input_ids.to(self.device), None)
        self.tokens, self.prompt_len = input_ids[0].tolist(), int(input_ids.shape[1])
        return next_token(logits[-1], self.sampling)

    def draft(self, generated: list[int]) -> Proposal:
        self.tokens += generated[len(self.tokens) - self.prompt_len:]
        self.p = len(self.tokens) - 1  # the anchor's position; the target has seen 0..p-1
        if not self.num_draft:
            return Proposal(torch.zeros(0, dtype=torch.long, device=self.device))
        proposal = self.proposer.propose_block(self.tokens, self.features, self.num_draft, self.sampling)
        return Proposal(proposal.tokens.to(self.device), None if proposal.q is None else proposal.q.to(self.device))

    def verify(self, proposal: Proposal):
        block_ids = torch.cat([torch.tensor([self.tokens[-1]], device=self.device), proposal.tokens]).unsqueeze(0)
        logits, self.cache, self.step_features = _target_forward(self.target, self.layer_ids, block_ids, self.cache)
        return proposal, *accept(proposal, logits, self.sampling)

    def accept(self, pending) -> tuple[list[int], int, int]:
        proposal, accepted, bonus = pending
        return proposal.tokens[:accepted].tolist(), accepted, bonus

    def keep(self, accepted: int) -> None:
        crop_cache(self.cache, self.p + accepted + 1)  # the verified positions: the anchor and the accepted drafts
        feats = self.step_features
        self.features = feats[:, : accepted + 1] if feats is not None else None


def _block_size(proposer, block_size: int | None) -> int:
    native = int(proposer.block_size)
    block = native if block_size is None else int(block_size)
    if not 1 <= block <= native:
        raise ValueError(f"block_size must be in 1..{native} (the drafter's), got {block}")
    return block


@torch.no_grad()
def speculative_generate(
    target,
    drafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    block_size: int | None = None,
    temperature: float = 0.0,
    top_p: float | None = None,
    stop_token_ids=(),
    generator: torch.Generator | None = None,
) -> SpecResult:
    """Decode up to ``max_new_tokens`` after ``input_ids`` [1, s] with DFlash drafting.

    ``drafter``: a :class:`DFlashDrafter` (wrapped in :class:`DFlashProposer`) or any
    proposer (:func:`~.proposers.as_proposer`). ``block_size`` defaults to the drafter's and
    may be smaller (1 = no drafts: every step verifies only the last token). ``temperature``
    0 is greedy; > 0 is speculative sampling (lossless w.r.t. the target's warped
    distribution). Stops after a token in ``stop_token_ids``.
    """
    _check_single(input_ids)
    proposer = as_proposer(target, drafter)
    block = _block_size(proposer, block_size)
    steps = _HFSteps(target, proposer, block - 1, Sampling(temperature, top_p, generator))
    return speculative_loop(steps, input_ids, max_new_tokens, block, stop_token_ids, HostClock(target.device))


@torch.no_grad()
def target_generate(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float | None = None,
    stop_token_ids=(),
    generator: torch.Generator | None = None,
    record_topk: int = 0,
) -> GenResult:
    """Plain target-only decoding, one token per forward with a KV cache.

    ``record_topk`` > 0 keeps the top-k logits of every step (for the bf16 lossless
    check's near-tie diagnosis).
    """
    _check_single(input_ids)
    steps = _HFPlainSteps(target, Sampling(temperature, top_p, generator))
    return plain_loop(steps, input_ids, max_new_tokens, stop_token_ids, record_topk, HostClock(target.device))


class _HFPlainSteps:
    """The plain loop's engine steps (:class:`~.core.PlainSteps`) over a HF cache."""

    def __init__(self, target, sampling: Sampling) -> None:
        self.target, self.sampling, self.cache = target, sampling, None

    def prefill(self, input_ids: torch.Tensor):
        return self._forward(input_ids.to(self.target.device))

    def step(self, token: int, position: int):
        return self._forward(torch.tensor([[token]], device=self.target.device))

    def _forward(self, ids: torch.Tensor):
        logits, self.cache, _ = _target_forward(self.target, [], ids, self.cache)
        return logits[-1], choose_next(logits[-1], self.sampling)
