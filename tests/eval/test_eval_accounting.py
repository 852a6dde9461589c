"""``eval/accounting.py``, the one count of tau, pinned case by case: its edges (no verify step,
the prefill's token, old reports without ``kept_lengths``) are where a wrong number is silent.
Written against the survivors of ``scripts/mutation.sh accounting`` (docs/results/mutation/)."""

from __future__ import annotations

import math

import pytest

from dflash_train.eval.accounting import kept_and_steps, per_prompt_tau, pooled_tau, prompt_tau, verified_tau


def test_kept_tokens_come_from_kept_lengths_or_from_new_tokens_less_the_prefill():
    assert kept_and_steps({"kept_lengths": [3, 1, 2], "acceptance_lengths": [4, 1, 2]}) == (6, 3)
    assert kept_and_steps({"acceptance_lengths": [4, 1], "new_tokens": 6}) == (5, 2)
    assert kept_and_steps({"acceptance_lengths": [1], "new_tokens": 1}) == (0, 1)  # the prefill's token only
    assert kept_and_steps({"acceptance_lengths": [1], "new_tokens": 0}) == (0, 1)  # never negative
    assert kept_and_steps({"acceptance_lengths": [], "new_tokens": 1}) == (0, 0)  # ended at the prefill
    assert kept_and_steps({"new_tokens": 5}) == (0, 0)
    assert kept_and_steps({"acceptance_lengths": [2, 2]}) is None  # neither: cannot be recounted


def test_a_prompt_without_a_verify_step_has_tau_zero_and_is_left_out_of_the_means():
    ended = {"kept_lengths": []}
    assert prompt_tau(ended) == 0.0
    assert prompt_tau({"kept_lengths": [3, 1]}) == 2.0
    assert per_prompt_tau([ended, {"kept_lengths": [3, 1]}, {"kept_lengths": [4]}]) == 3.0
    assert pooled_tau([ended, {"kept_lengths": [3, 1]}, {"kept_lengths": [5]}]) == 3.0


def test_no_verify_step_at_all_is_nan_not_an_error():
    for tau in (pooled_tau, per_prompt_tau, verified_tau):
        assert math.isnan(tau([])), tau
    assert math.isnan(pooled_tau([{"kept_lengths": []}]))
    assert math.isnan(per_prompt_tau([{"kept_lengths": []}]))
    assert math.isnan(verified_tau([{"acceptance_lengths": []}]))


def test_verified_tau_counts_acceptance_as_verified_cut_drafts_included():
    prompts = [{"acceptance_lengths": [4, 2], "kept_lengths": [3, 2]}, {"acceptance_lengths": [3]}]
    assert verified_tau(prompts) == 3.0
    assert pooled_tau(prompts[:1]) == 2.5


def test_a_result_that_cannot_be_recounted_is_one_line_naming_what_it_lacks():
    with pytest.raises(ValueError, match=r"^a per-prompt result without 'kept_lengths' or 'new_tokens': its tau "
                                         r"cannot be counted on kept tokens$"):
        pooled_tau([{"acceptance_lengths": [2]}])
