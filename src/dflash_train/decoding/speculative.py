"""DFlash speculative decoding (greedy and sampling), plain target decoding, drafter cache.

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

``tau`` of a verify step = accepted drafts + 1.

Anything with the :class:`Proposer` interface can stand in for the drafter (tests
plug in oracles); :class:`DFlashProposer` wraps a :class:`DFlashDrafter`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from dflash_train.devices import synchronize
from dflash_train.hf_compat import cache_kwarg
from dflash_train.models.attention import decode_masks


# ---------------------------------------------------------------------------------------
# drafter context cache
# ---------------------------------------------------------------------------------------
class DrafterContextCache:
    """Per-layer K/V of the drafter's *context* positions (never block K/V).

    ``DFlashAttention.forward`` calls :meth:`extend` with the K/V of the new context
    positions (RoPE already applied) and attends over the full returned tensors.
    All layers see the same new positions, so the cache length is layer 0's.
    """

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def extend(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k``/``v`` [b, kv_heads, new, d]; return this layer's full cached K/V."""
        if layer_idx in self.keys:
            k = torch.cat([self.keys[layer_idx], k], dim=2)
            v = torch.cat([self.values[layer_idx], v], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v

    def get_seq_length(self) -> int:
        if not self.keys:
            return 0
        return next(iter(self.keys.values())).shape[2]

    def __len__(self) -> int:
        return self.get_seq_length()

    def crop(self, length: int) -> None:
        """Keep the first ``length`` context positions of every layer."""
        for i in list(self.keys):
            self.keys[i] = self.keys[i][:, :, :length]
            self.values[i] = self.values[i][:, :, :length]

    def reset(self) -> None:
        self.keys.clear()
        self.values.clear()


# ---------------------------------------------------------------------------------------
# proposers
# ---------------------------------------------------------------------------------------
@runtime_checkable
class Proposer(Protocol):
    """What the speculative loop needs from a drafter.

    ``feature_layer_ids``: target layers whose outputs the proposer consumes (may be
    empty). ``block_size``: its native block size. ``reset()`` starts a new sequence.
    ``propose(tokens, new_features, num_draft)`` gets every committed token so far
    (prompt + generated; the last one sits at position ``p = len(tokens) - 1`` and has
    not been seen by the target), the target features of the positions added since the
    previous call (``[1, m, n*h]``, positions ``p-m .. p-1``; ``None`` when
    ``feature_layer_ids`` is empty) and returns draft logits ``[num_draft, vocab]``
    for positions ``p+1 .. p+num_draft``. Greedy decoding drafts their argmax;
    sampling drafts from their softmax (the ``q`` of speculative sampling).
    """

    feature_layer_ids: list[int]
    block_size: int

    def reset(self) -> None: ...

    def propose(self, tokens: list[int], new_features: torch.Tensor | None, num_draft: int) -> torch.Tensor: ...


class DFlashProposer:
    """A :class:`DFlashDrafter` plus the target's frozen embedding and lm_head."""

    def __init__(self, target, drafter) -> None:
        self.target = target
        self.drafter = drafter
        cfg = drafter.config
        self.feature_layer_ids = list(_cfg(cfg, "target_layer_ids"))
        self.mask_token_id = int(_cfg(cfg, "mask_token_id"))
        self.block_size = int(drafter.block_size)
        self.cache = DrafterContextCache()

    def reset(self) -> None:
        self.cache.reset()

    @torch.no_grad()
    def propose(self, tokens: list[int], new_features: torch.Tensor | None, num_draft: int) -> torch.Tensor:
        if new_features is None:
            raise ValueError("DFlashProposer needs target features")
        p = len(tokens) - 1
        m = new_features.shape[1]
        if len(self.cache) + m != p:
            raise RuntimeError(f"drafter cache holds {len(self.cache)} positions + {m} new != position {p}")
        device = self.target.device
        dtype = next(self.drafter.parameters()).dtype
        block_ids = torch.full((1, num_draft + 1), self.mask_token_id, dtype=torch.long, device=device)
        block_ids[0, 0] = tokens[-1]
        block_embeds = self.target.embed(block_ids).to(dtype)
        block_pos = torch.arange(p, p + num_draft + 1, device=device).unsqueeze(0)
        ctx_pos = torch.arange(p - m, p, device=device).unsqueeze(0)
        masks = decode_masks(self.drafter.layer_types, p, p, num_draft + 1, self.drafter.sliding_window, device)
        hidden = self.drafter(block_embeds, new_features.to(dtype), block_pos, ctx_pos, masks=masks, cache=self.cache)
        weight = self.target.lm_head_weight
        return F.linear(hidden[0, 1:].to(weight.dtype), weight).float()


def _cfg(config, name, default=None):
    value = getattr(config, name, None)
    if value is None:
        value = (getattr(config, "dflash_config", None) or {}).get(name, default)
    return default if value is None else value


def as_proposer(target, drafter) -> Proposer:
    if isinstance(drafter, Proposer) and not isinstance(drafter, torch.nn.Module):
        return drafter
    return DFlashProposer(target, drafter)


# ---------------------------------------------------------------------------------------
# sampling helpers
# ---------------------------------------------------------------------------------------
def warp(logits: torch.Tensor, temperature: float, top_p: float | None = None) -> torch.Tensor:
    """Probabilities from logits [..., V] at ``temperature`` (> 0), optionally nucleus-filtered."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Sample one index per row of ``probs`` [n, V] -> [n]."""
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).view(-1).to(probs.device)


def _uniform(n: int, device, generator: torch.Generator | None) -> torch.Tensor:
    gen_device = generator.device if generator is not None else device
    return torch.rand(n, generator=generator, device=gen_device).to(device)


def speculative_accept(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Speculative sampling over one block.

    ``p`` [n+1, V]: target probabilities at the n draft positions and the one after;
    ``q`` [n, V]: the drafter's probabilities the drafts were sampled from;
    ``drafts`` [n]. Draft ``i`` is accepted with probability ``min(1, p_i(d)/q_i(d))``;
    at the first rejection the next token is sampled from ``norm(max(p_i - q_i, 0))``;
    if all are accepted it is sampled from ``p_n``. Returns (accepted, next_token).
    The committed tokens are then distributed exactly as the target's ``p``.
    """
    n = drafts.shape[0]
    if n:
        rows = torch.arange(n, device=p.device)
        p_d, q_d = p[rows, drafts], q[rows, drafts]
        ok = _uniform(n, p.device, generator) * q_d < p_d  # P(ok) = min(1, p/q)
        accepted = int(ok.long().cumprod(0).sum())
    else:
        accepted = 0
    if accepted < n:
        residual = (p[accepted] - q[accepted]).clamp_min(0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[accepted]
    else:
        dist = p[n]
    return accepted, int(_sample(dist.unsqueeze(0), generator)[0])


def greedy_accept(target_logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """``target_logits`` [n+1, V]: accept ``d_i`` while it equals the target's argmax at
    the previous position; the next token is the target's argmax after the last accepted."""
    choice = target_logits.argmax(-1)
    n = drafts.shape[0]
    accepted = int((drafts == choice[:n]).long().cumprod(0).sum()) if n else 0
    return accepted, int(choice[accepted])


# ---------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------
@dataclass
class SpecResult:
    """One prompt's speculative decode.

    ``tokens``: new tokens (prompt excluded). ``acceptance_lengths``: tau of every verify
    step (accepted drafts + 1, as verified, before any stop/limit truncation).
    ``position_reached[k-1]`` / ``position_accepted[k-1]``: how many verify steps
    reached / accepted draft position k (k = 1 .. B-1); P(k accepted | reached) is
    their ratio. Times in seconds; decode excludes the prefill (the first token).
    """

    tokens: list[int]
    acceptance_lengths: list[int]
    position_reached: list[int]
    position_accepted: list[int]
    block_size: int
    prefill_time: float = 0.0
    decode_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0

    @property
    def num_steps(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_tau(self) -> float:
        return sum(self.acceptance_lengths) / max(1, len(self.acceptance_lengths))

    @property
    def decode_tokens_per_s(self) -> float:
        return max(0, len(self.tokens) - 1) / self.decode_time if self.decode_time > 0 else 0.0


@dataclass
class GenResult:
    """Plain target decode. ``topk_values``/``topk_ids`` [steps, k] (when recorded): the
    target's top-k logits at every generated token (row i produced ``tokens[i]``)."""

    tokens: list[int]
    prefill_time: float = 0.0
    decode_time: float = 0.0
    topk_values: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    @property
    def decode_tokens_per_s(self) -> float:
        return max(0, len(self.tokens) - 1) / self.decode_time if self.decode_time > 0 else 0.0


def record_step(result: SpecResult, accepted: int, num_draft: int) -> None:
    """Per verify step: tau, and which draft positions were reached / accepted."""
    result.acceptance_lengths.append(accepted + 1)
    for k in range(min(accepted + 1, num_draft)):
        result.position_reached[k] += 1
    for k in range(accepted):
        result.position_accepted[k] += 1


def _truncate(new: list[int], budget: int, stop: set[int]) -> tuple[list[int], bool]:
    """Cut ``new`` after the first stop token or at ``budget`` tokens; (kept, finished)."""
    for i, tok in enumerate(new[:budget]):
        if tok in stop:
            return new[: i + 1], True
    kept = new[:budget]
    return kept, len(kept) >= budget


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


def _next_token(logits: torch.Tensor, temperature: float, top_p, generator) -> int:
    if temperature <= 0:
        return int(logits.argmax(-1))
    return int(_sample(warp(logits, temperature, top_p).unsqueeze(0), generator)[0])


# ---------------------------------------------------------------------------------------
# decoders
# ---------------------------------------------------------------------------------------
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
    :class:`Proposer`. ``block_size`` defaults to the drafter's and may be smaller
    (1 = no drafts: every step verifies only the last token). ``temperature`` 0 is
    greedy; > 0 is speculative sampling (lossless w.r.t. the target's warped
    distribution). Stops after a token in ``stop_token_ids``.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [1, s], got {tuple(input_ids.shape)}")
    proposer = as_proposer(target, drafter)
    native = int(proposer.block_size)
    block = native if block_size is None else int(block_size)
    if not 1 <= block <= native:
        raise ValueError(f"block_size must be in 1..{native} (the drafter's), got {block}")
    num_draft = block - 1
    stop = {int(t) for t in stop_token_ids}
    layer_ids = list(proposer.feature_layer_ids)
    device = target.device
    input_ids = input_ids.to(device)
    result = SpecResult([], [], [0] * num_draft, [0] * num_draft, block)
    if max_new_tokens <= 0:
        return result
    proposer.reset()

    synchronize(device)
    t0 = time.perf_counter()
    logits, cache, features = _target_forward(target, layer_ids, input_ids, None)
    first = _next_token(logits[-1], temperature, top_p, generator)
    synchronize(device)
    t1 = time.perf_counter()
    result.prefill_time = t1 - t0

    tokens = input_ids[0].tolist() + [first]
    generated = [first]
    finished = first in stop or max_new_tokens <= 1
    while not finished:
        p = len(tokens) - 1  # position of the last committed token; the target has seen 0..p-1
        ta = time.perf_counter()
        if num_draft:
            draft_logits = proposer.propose(tokens, features, num_draft).to(device)
            if temperature <= 0:
                drafts = draft_logits.argmax(-1)
                q = None
            else:
                q = warp(draft_logits, temperature, top_p)
                drafts = _sample(q, generator)
        else:
            drafts = torch.zeros(0, dtype=torch.long, device=device)
            q = None
        synchronize(device)
        tb = time.perf_counter()
        block_ids = torch.cat([torch.tensor([tokens[-1]], device=device), drafts]).unsqueeze(0)
        logits, cache, feats = _target_forward(target, layer_ids, block_ids, cache)
        if temperature <= 0:
            accepted, bonus = greedy_accept(logits, drafts)
        else:
            accepted, bonus = speculative_accept(warp(logits, temperature, top_p), q, drafts, generator)
        synchronize(device)
        result.draft_time += tb - ta
        result.verify_time += time.perf_counter() - tb

        record_step(result, accepted, num_draft)

        new = drafts[:accepted].tolist() + [bonus]
        new, finished = _truncate(new, max_new_tokens - len(generated), stop)
        generated += new
        tokens += new
        if not finished:
            crop_cache(cache, p + accepted + 1)  # keep the verified positions: last token + accepted drafts
            features = feats[:, : accepted + 1] if feats is not None else None
    synchronize(device)
    result.decode_time = time.perf_counter() - t1
    result.tokens = generated
    return result


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
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [1, s], got {tuple(input_ids.shape)}")
    stop = {int(t) for t in stop_token_ids}
    device = target.device
    ids = input_ids.to(device)
    result = GenResult([])
    if max_new_tokens <= 0:
        return result
    top_vals, top_ids = [], []
    cache = None
    synchronize(device)
    t0 = time.perf_counter()
    t1 = None
    while True:
        logits, cache, _ = _target_forward(target, [], ids, cache)
        logits = logits[-1]
        if record_topk:
            v, i = logits.topk(record_topk)
            top_vals.append(v)
            top_ids.append(i)
        tok = _next_token(logits, temperature, top_p, generator)
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
    if record_topk:
        result.topk_values = torch.stack(top_vals).cpu()
        result.topk_ids = torch.stack(top_ids).cpu()
    return result
