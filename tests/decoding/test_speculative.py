"""Greedy speculative decoding: lossless, acceptance bookkeeping, drafter cache."""

from __future__ import annotations

import pytest
import torch
from testkit import (
    NoisyCheckedProposer,
    one_hot_logits,
    random_prompts,
    tiny_drafter,
    tiny_qwen3,
)

from dflash_train.decoding.speculative import (
    DFlashProposer,
    DrafterContextCache,
    greedy_accept,
    speculative_generate,
    target_generate,
)
from dflash_train.models.attention import build_masks
from dflash_train.models.target import Target

VOCAB = 128


@pytest.fixture(scope="module")
def target():
    return Target(tiny_qwen3(vocab=VOCAB))


@pytest.fixture(scope="module")
def drafter(target):
    return tiny_drafter(target, block_size=8)[0]


def prompts(n, seed=0):
    return random_prompts(n, seed, VOCAB)


class OracleProposer:
    """Proposes the target's own greedy continuation (or, with ``wrong``, a token that
    is certainly not the target's next choice)."""

    feature_layer_ids: list[int] = []

    def __init__(self, prompt_len, continuation, block_size, wrong=False):
        self.prompt_len, self.continuation, self.block_size, self.wrong = prompt_len, continuation, block_size, wrong

    def reset(self):
        pass

    def propose(self, tokens, new_features, num_draft):
        g = len(tokens) - self.prompt_len  # index of the next token in the continuation
        want = (self.continuation[g:] + [0] * num_draft)[:num_draft]
        if self.wrong:
            want = [(t + 1) % VOCAB for t in want]
        return one_hot_logits(want)


@pytest.mark.parametrize("block_size", [1, 2, 4, 8])
def test_greedy_lossless_random_drafter(target, drafter, block_size):
    for ids in prompts(4, seed=block_size):
        plain = target_generate(target, ids, 16)
        spec = speculative_generate(target, drafter, ids, 16, block_size=block_size)
        assert spec.tokens == plain.tokens
        assert len(spec.tokens) == 16
        assert all(1 <= t <= block_size for t in spec.acceptance_lengths)
        # every step commits tau tokens (the last step may be cut at the limit)
        assert sum(spec.acceptance_lengths) >= 15 and sum(spec.acceptance_lengths[:-1]) < 15
        assert len(spec.position_reached) == block_size - 1


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_greedy_lossless_with_partial_acceptance_and_cache_check(target, drafter, block_size):
    seen = set()
    for i, ids in enumerate(prompts(3, seed=10 + block_size)):
        plain = target_generate(target, ids, 30 + block_size)
        proposer = NoisyCheckedProposer(target, drafter, ids.shape[1], plain.tokens, seed=i)
        spec = speculative_generate(target, proposer, ids, 30, block_size=block_size)
        assert spec.tokens == plain.tokens[:30]
        assert proposer.checked == spec.num_steps
        seen.update(spec.acceptance_lengths)
        # bookkeeping: position k reached iff accepted >= k-1; accepted iff accepted >= k
        for k in range(1, block_size):
            assert spec.position_reached[k - 1] == sum(t >= k for t in spec.acceptance_lengths)
            assert spec.position_accepted[k - 1] == sum(t >= k + 1 for t in spec.acceptance_lengths)
    assert len(seen) >= min(block_size, 3)  # the accept path really was exercised at several lengths


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_oracle_gives_full_blocks_and_wrong_gives_one(target, block_size):
    ids = prompts(1, seed=3)[0]
    plain = target_generate(target, ids, 30 + block_size)
    oracle = OracleProposer(ids.shape[1], plain.tokens, block_size)
    spec = speculative_generate(target, oracle, ids, 30, block_size=block_size)
    assert spec.tokens == plain.tokens[:30]
    assert spec.acceptance_lengths == [block_size] * len(spec.acceptance_lengths)
    assert spec.num_steps == -(-29 // block_size)  # the first token comes from the prefill
    assert spec.position_accepted == spec.position_reached == [spec.num_steps] * (block_size - 1)

    wrong = OracleProposer(ids.shape[1], plain.tokens, block_size, wrong=True)
    spec = speculative_generate(target, wrong, ids, 30, block_size=block_size)
    assert spec.tokens == plain.tokens[:30]
    assert spec.acceptance_lengths == [1] * 29
    assert spec.mean_tau == 1.0
    assert spec.position_accepted == [0] * (block_size - 1)


def test_stop_tokens_and_limit(target, drafter):
    ids = prompts(1, seed=5)[0]
    plain = target_generate(target, ids, 30)
    stop = plain.tokens[9]
    first = plain.tokens.index(stop)
    plain_stop = target_generate(target, ids, 30, stop_token_ids=[stop, VOCAB - 1])
    assert plain_stop.tokens == plain.tokens[: first + 1]
    oracle = OracleProposer(ids.shape[1], plain.tokens + [0] * 8, 8)
    for proposer in (oracle, drafter):
        spec = speculative_generate(target, proposer, ids, 30, stop_token_ids=[stop, VOCAB - 1])
        assert spec.tokens == plain_stop.tokens
    spec = speculative_generate(target, oracle, ids, 5)  # the limit cuts an accepted run
    assert spec.tokens == plain.tokens[:5]
    assert speculative_generate(target, oracle, ids, 1).tokens == plain.tokens[:1]


def test_block_size_override_checked(target, drafter):
    ids = prompts(1)[0]
    with pytest.raises(ValueError, match="block_size"):
        speculative_generate(target, drafter, ids, 4, block_size=9)
    with pytest.raises(ValueError, match="block_size"):
        speculative_generate(target, drafter, ids, 4, block_size=0)


def test_greedy_accept_rule():
    logits = one_hot_logits([5, 6, 7, 8])
    assert greedy_accept(logits, torch.tensor([5, 6, 7])) == (3, 8)
    assert greedy_accept(logits, torch.tensor([5, 9, 7])) == (1, 6)
    assert greedy_accept(logits, torch.tensor([4, 6, 7])) == (0, 5)
    assert greedy_accept(logits[:1], torch.tensor([], dtype=torch.long)) == (0, 5)


def test_context_cache_extend_and_crop():
    """Appending: what comes back is every position held, in order (the reference: a cat of all the
    K/V given), across buffer growth, a crop and a reset."""
    cache = DrafterContextCache()
    k1, v1 = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    k2, v2 = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4)
    for layer in range(2):
        k, v = cache.extend(layer, k1, v1)
        assert torch.equal(k, k1) and torch.equal(v, v1)
    k, v = cache.extend(0, k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    assert len(cache) == 5
    cache.crop(4)
    assert cache.lengths == [4, 3]
    k, _ = cache.extend(1, k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], 2))
    ks = [torch.randn(1, 2, n, 4) for n in (1, 5, 2, 9, 1)]  # grows past twice its size, then within it
    k, _ = cache.extend(0, ks[0], ks[0])
    for more in ks[1:]:
        k, v = cache.extend(0, more, more)
    assert torch.equal(k, torch.cat([k1, k2[:, :, :1], *ks], 2))
    assert torch.equal(v, torch.cat([v1, v2[:, :, :1], *ks], 2))
    cache.reset()
    assert len(cache) == 0


def test_context_cache_slotted_writes_at_its_slots_and_returns_them_all():
    """Slotted (the static engine's): rows go to ``write_pos`` (unwanted rows to a scratch slot), cast to
    the cache's dtype, and every slot comes back, at a fixed address."""
    cache = DrafterContextCache.slotted(2, 2, 4, 6, torch.float64, "cpu")
    address = cache.k[1].data_ptr()
    k = torch.randn(1, 2, 3, 4)
    cache.write_pos = torch.tensor([0, 1, 5])
    got, _ = cache.extend(1, k, k)
    cache.write_pos = torch.tensor([2, 5, 5])
    got, _ = cache.extend(1, 2 * k, 2 * k)
    assert got.shape == (1, 2, 6, 4) and got.dtype == torch.float64 and got.data_ptr() == address
    want = torch.zeros(1, 2, 6, 4, dtype=torch.float64)
    want[:, :, 0:2], want[:, :, 2] = k[:, :, 0:2], 2 * k[:, :, 0]
    assert torch.equal(got[:, :, :3], want[:, :, :3]) and not got[:, :, 3:5].any()
    assert not cache.k[0].any()


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
def test_proposer_matches_training_forward(target, layer_types):
    """Cached, incremental drafting == the training forward (dense training mask) for the
    block anchored at p, for full and sliding-window layers."""
    drafter, cfg = tiny_drafter(target, block_size=4, layer_types=layer_types,
                                sliding_window=3 if layer_types else None, seed=1)
    tokens = prompts(1, seed=7)[0][0].tolist() + [3, 4, 5, 6, 7, 8, 9, 10]
    p, p1, block = len(tokens) - 1, 5, 4
    feats = target.features(torch.tensor([tokens[:p]]), None, cfg.target_layer_ids)
    proposer = DFlashProposer(target, drafter)
    proposer.propose(tokens[: p1 + 1], feats[:, :p1], block - 1)
    logits = proposer.propose(tokens, feats[:, p1:], block - 1)

    masks = build_masks("sdpa", drafter.layer_types, torch.tensor([[p]]), torch.tensor([[True]]), p, block,
                        cfg.sliding_window)
    block_ids = torch.tensor([[tokens[-1]] + [cfg.mask_token_id] * (block - 1)])
    hidden = drafter(target.embed(block_ids), feats, torch.arange(p, p + block)[None], torch.arange(p)[None],
                     masks=masks)
    torch.testing.assert_close(logits, hidden[0, 1:] @ target.lm_head_weight.T, atol=1e-5, rtol=1e-5)
