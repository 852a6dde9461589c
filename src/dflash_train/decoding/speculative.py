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

``tau`` of a verify step = accepted drafts + 1. Proposals, acceptance and committing
are the shared :mod:`.core`; anything with its ``BlockProposer`` (or ``LogitsProposer``)
interface can stand in for the drafter (tests plug in oracles).
"""

from __future__ import annotations

import time

import torch

from dflash_train.devices import synchronize
from dflash_train.hf_compat import cache_kwarg

from .core import (
    GenResult,
    Proposal,
    Sampling,
    SpecLedger,
    SpecResult,
    TopK,
    accept,
    greedy_accept,
    next_token,
    speculative_accept,
    warp,
)
from .proposers import DFlashProposer, DrafterContextCache, as_proposer

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


class _HFVerifier:
    """The target side of the reference loop: prefill, then one forward per verified block
    over the HF cache, cropped to the verified positions after each step."""

    def __init__(self, target, layer_ids: list[int]) -> None:
        self.target, self.layer_ids, self.cache, self.device = target, layer_ids, None, target.device

    def prefill(self, input_ids: torch.Tensor):
        logits, self.cache, features = _target_forward(self.target, self.layer_ids, input_ids, None)
        return logits[-1], features

    def verify(self, anchor: int, drafts: torch.Tensor):
        block_ids = torch.cat([torch.tensor([anchor], device=self.device), drafts]).unsqueeze(0)
        logits, self.cache, features = _target_forward(self.target, self.layer_ids, block_ids, self.cache)
        return logits, features

    def keep(self, length: int) -> None:
        crop_cache(self.cache, length)


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
    ledger = SpecLedger(max_new_tokens, block, stop_token_ids)
    if ledger.finished:
        return ledger.done()
    proposer.reset()
    sampling = Sampling(temperature, top_p, generator)
    verifier = _HFVerifier(target, list(proposer.feature_layer_ids))
    device = target.device
    synchronize(device)
    t0 = time.perf_counter()
    logits, features = verifier.prefill(input_ids.to(device))
    ledger.start(next_token(logits, sampling))
    tokens = input_ids[0].tolist() + [ledger.last]
    synchronize(device)
    t1 = time.perf_counter()
    ledger.result.prefill_time = t1 - t0
    while not ledger.finished:
        features = _spec_step(proposer, verifier, ledger, tokens, features, sampling)
    synchronize(device)
    ledger.result.decode_time = time.perf_counter() - t1
    return ledger.done()


def _spec_step(proposer, verifier: _HFVerifier, ledger: SpecLedger, tokens: list[int], features, sampling):
    """One draft + verify + commit; extends ``tokens``; returns the next step's new features."""
    p = len(tokens) - 1  # the anchor's position; the target has seen 0..p-1
    device, num_draft = verifier.device, ledger.num_draft
    ta = time.perf_counter()
    if num_draft:
        proposal = proposer.propose_block(tokens, features, num_draft, sampling)
        proposal = Proposal(proposal.tokens.to(device), None if proposal.q is None else proposal.q.to(device))
    else:
        proposal = Proposal(torch.zeros(0, dtype=torch.long, device=device))
    synchronize(device)
    tb = time.perf_counter()
    logits, feats = verifier.verify(tokens[-1], proposal.tokens)
    accepted, bonus = accept(proposal, logits, sampling)
    synchronize(device)
    ledger.result.draft_time += tb - ta
    ledger.result.verify_time += time.perf_counter() - tb
    tokens += ledger.commit(proposal.tokens[:accepted].tolist(), accepted, bonus)
    if ledger.finished:
        return None
    verifier.keep(p + accepted + 1)  # the verified positions: the anchor and the accepted drafts
    return feats[:, : accepted + 1] if feats is not None else None


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
    stop = {int(t) for t in stop_token_ids}
    device = target.device
    ids = input_ids.to(device)
    result, topk, sampling = GenResult([]), TopK(record_topk), Sampling(temperature, top_p, generator)
    if max_new_tokens <= 0:
        return result
    cache, t1 = None, None
    synchronize(device)
    t0 = time.perf_counter()
    while True:
        logits, cache, _ = _target_forward(target, [], ids, cache)
        topk.add(logits[-1])
        tok = next_token(logits[-1], sampling)
        result.tokens.append(tok)
        if t1 is None:
            synchronize(device)
            t1 = time.perf_counter()
            result.prefill_time = t1 - t0
        if tok in stop or len(result.tokens) >= max_new_tokens:
            break
        ids = torch.tensor([[tok]], device=device)
    synchronize(device)
    result.decode_time = time.perf_counter() - t1
    return topk.store(result)
