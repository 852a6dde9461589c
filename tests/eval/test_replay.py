"""Replay (a walk over the target's greedy continuation) == real greedy speculative decoding."""

from __future__ import annotations

import json

import pytest
import torch
from testkit import NoisyCheckedProposer, random_prompts, tiny_drafter, tiny_qwen3

from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.eval.replay import greedy_references, load_or_make_references, replay, replay_one
from dflash_train.models.target import Target

VOCAB = 128


@pytest.fixture(scope="module")
def target():
    return Target(tiny_qwen3(vocab=VOCAB))


def prompts(n, seed=0):
    return random_prompts(n, seed, VOCAB)


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_walk_equals_real_loop_with_partial_acceptance(target, block_size):
    """A proposer whose drafts are the greedy continuation corrupted at random: acceptance
    lengths vary over 1..B. Same steps, same lengths, same tokens as the real loop; the
    proposer also checks every call's features against a cache-free forward."""
    drafter = tiny_drafter(target, block_size=8)[0]
    lengths = set()
    for i, ids in enumerate(prompts(3, seed=block_size)):
        n = 30
        cont = target_generate(target, ids, n + block_size).tokens
        real_proposer = NoisyCheckedProposer(target, drafter, ids.shape[1], cont, seed=i)
        real = speculative_generate(target, real_proposer, ids, n, block_size=block_size)
        walk_proposer = NoisyCheckedProposer(target, drafter, ids.shape[1], cont, seed=i)
        walked = replay_one(target, walk_proposer, ids, cont, n, block_size - 1, stop=set())
        assert walked.acceptance_lengths == real.acceptance_lengths
        assert walked.tokens == real.tokens
        assert walked.position_reached == real.position_reached
        assert walked.position_accepted == real.position_accepted
        assert walk_proposer.checked == real_proposer.checked == real.num_steps
        lengths.update(real.acceptance_lengths)
    assert len(lengths) >= min(block_size, 3)


def test_real_drafter_report_equals_eval(target):
    """The untrained tiny drafter itself (its own argmax drafts), through ``replay``: the
    report's tau fields equal the real loop's, prompt by prompt."""
    from dflash_train.eval.evaluate import evaluate

    drafter = tiny_drafter(target, block_size=4, seed=5)[0]
    ids = prompts(4, seed=9)
    conts = greedy_references(target, ids, 20 + 4)
    mine = replay(target, drafter, ids, conts, 20, stop_token_ids=[])
    real = evaluate(target, drafter, ids, max_new_tokens=20, baseline=False, warmup=False, stop_token_ids=[])
    assert mine["tau_per_prompt"] == real["tau_per_prompt"]
    assert mine["per_position_accepted"] == real["per_position_accepted"]
    assert mine["mean_tau"] == real["mean_tau"] and mine["engine"] == "replay"


def test_stop_token_ends_the_walk_like_the_real_loop(target):
    """A stop token inside the continuation: the real loop counts the block's accepted
    drafts (past the stop) and then cuts; the walk must end on the same step."""
    drafter = tiny_drafter(target, block_size=8)[0]
    ids = prompts(1, seed=4)[0]
    cont = target_generate(target, ids, 40 + 8).tokens
    stop = {cont[9]}  # the 10th generated token (or an earlier equal one) stops the decode
    real = speculative_generate(target, NoisyCheckedProposer(target, drafter, ids.shape[1], cont, seed=1),
                                ids, 40, stop_token_ids=stop)
    walked = replay_one(target, NoisyCheckedProposer(target, drafter, ids.shape[1], cont, seed=1),
                        ids, cont, 40, 7, stop)
    assert len(real.tokens) <= 10
    assert walked.tokens == real.tokens and walked.acceptance_lengths == real.acceptance_lengths


def test_short_continuation_refused(target):
    drafter = tiny_drafter(target, block_size=4)[0]
    ids = prompts(1)[0]
    with pytest.raises(ValueError, match="continuation has 10 tokens"):
        replay_one(target, drafter, ids, [1] * 10, 20, 3, set())


def test_references_file_reused_only_for_the_same_key(tmp_path):
    path = tmp_path / "refs.json"
    made = []
    first = load_or_make_references(path, "k1", lambda: made.append(1) or [[1, 2]])
    again = load_or_make_references(path, "k1", lambda: made.append(2) or [[9]])
    other = load_or_make_references(path, "k2", lambda: made.append(3) or [[3]])
    assert first == again == [[1, 2]] and other == [[3]] and made == [1, 3]
    assert json.loads(path.read_text())["key"] == "k2"


def test_static_references_fit_a_block_past_the_longest_prompt(target):
    """The static engine reserves one drafter block past the end: continuations of
    max_new + block tokens must fit (this sizing failed on the GPU once: prompt 43 +
    144 + 16 > 192). Same tokens as the reference loop."""
    drafter = tiny_drafter(target, block_size=8)[0]
    ids = [torch.randint(0, VOCAB - 1, (1, n), generator=torch.Generator().manual_seed(n)) for n in (43, 5)]
    length = 136 + 8  # 43 + 144 + 8 > 192: the old sizing (rounded up to 64) refused this
    static = greedy_references(target, ids, length, engine="static", drafter=drafter)
    assert static == greedy_references(target, ids, length, engine="hf")
    assert [len(c) for c in static] == [length, length]


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
def test_batched_blocks_equal_step_by_step_drafting(target, layer_types):
    """Every block of a prompt in one training-style forward == the proposer drafting block
    by block with its cache (logits at every anchor), and the batched walk == the walk."""
    from dflash_train.decoding.speculative import DFlashProposer
    from dflash_train.eval.replay import block_states, replay_one_batched

    drafter = tiny_drafter(target, block_size=6, layer_types=layer_types,
                           sliding_window=3 if layer_types else None, seed=4)[0]
    ids = prompts(1, seed=21)[0]
    n, num_draft = 14, 5
    cont = target_generate(target, ids, n + num_draft + 1).tokens
    sequence, prompt_len = ids[0].tolist() + cont, ids.shape[1]
    anchors = list(range(prompt_len, prompt_len + n))
    batched = block_states(target, drafter, sequence, anchors, num_draft) @ target.lm_head_weight.T
    features = target.features(torch.tensor([sequence[: anchors[-1]]]), None, drafter.config.target_layer_ids)
    proposer, fed = DFlashProposer(target, drafter), 0
    for i, p in enumerate(anchors):
        logits = proposer.propose(sequence[: p + 1], features[:, fed:p], num_draft)
        fed = p
        torch.testing.assert_close(batched[i], logits, atol=1e-5, rtol=1e-5)
    walked = replay_one(target, DFlashProposer(target, drafter), ids, cont, n, num_draft, set())
    assert replay_one_batched(target, drafter, ids, cont, n, num_draft, set()).acceptance_lengths == \
        walked.acceptance_lengths
