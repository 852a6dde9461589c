"""Served for real: our drafters in the pinned vLLM (``make vllm`` installs it; ``make test`` does).

Marked ``vllm``: these need the install (~/.cache/dflash_train/vllm/<version>/). Without it they skip
on a developer's machine and **fail in CI** (``CI`` set), where ``make test`` installs it first.

- every kind's export loaded into vLLM's own model class (its config parsing and ``load_weights``, on
  the CPU, no runner): every tensor lands where vLLM computes with it, equal, and every field we rely on
  is read as we meant; an export without vLLM's confidence-head keys shows its head dropped;
- end to end on the DFlash drafter trained here to accept (SmolLM2's own greedy answers to three
  prompts, memorized): ``eval --engine vllm``: vLLM's output = its plain greedy = ours, its accepted
  drafts equal ours step for step, tau by our rule equal, its own mean acceptance length = our tau as
  verified, its counters equal its per-request steps.
"""

from __future__ import annotations

import json
import os

import pytest
from served import NEW_TOKENS, prompts_file, random_serving_folder, train_memorized, write_answers

from dflash_train.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_python():
    from dflash_train.vllm.install import find_python

    try:
        return find_python()
    except FileNotFoundError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the vLLM tests: {err}")
        pytest.skip(str(err))


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "dspark"])
def test_every_kind_loads_in_vllms_own_class(vllm_python, smollm2_path, tmp_path, kind):
    from dflash_train.vllm import MODEL_FILES
    from dflash_train.vllm.loader_check import check_folder

    folder = random_serving_folder(kind, smollm2_path, tmp_path / "drafter")
    report = check_folder(folder, smollm2_path, vllm_python)
    assert report["class"].startswith(f"vllm.model_executor.models.{MODEL_FILES[kind].removesuffix('.py')}.")
    assert report["ok"], report
    ours = json.loads((folder / "config.json").read_text())
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        names = list(fh.keys())
    fused = sum(n.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")) for n in names)
    assert len(report["tensors"]["equal"]) == len(names) - fused  # q/k/v and gate/up land fused, the rest 1:1
    assert report["fields"]["aux_layer_ids"]["vllm"] == [2, 8, 14] == [i + 1 for i in ours["dflash_config"]["target_layer_ids"]]
    assert report["fields"]["num_speculative_tokens"]["vllm"] == 7
    if kind == "dspark":
        assert report["speculative_config"]["method"] == "dspark"
        assert report["fields"]["has_confidence_head"]["vllm"] is True and report["fields"]["markov_rank"]["vllm"] == 32


def test_a_sliding_window_layer_is_causal_in_vllm_as_in_ours(vllm_python, smollm2_path, tmp_path):
    """docs/spec.md: a sliding-window drafter layer is causal inside the block; vLLM reads it so from
    ``layer_types`` (``qwen3_dflash.py``, ``_dflash_layer_causal``)."""
    from dflash_train.vllm.loader_check import check_folder

    folder = random_serving_folder("dflash", smollm2_path, tmp_path / "drafter", sliding_window=64,
                                   layer_types=["sliding_attention", "full_attention"])
    report = check_folder(folder, smollm2_path, vllm_python)
    assert report["ok"], report
    assert report["fields"]["causal_layers"]["vllm"] == [True, False]


def test_a_dspark_export_without_vllms_keys_loses_its_confidence_head(vllm_python, smollm2_path, tmp_path):
    """The exports before vLLM's keys were written (``has_confidence_head`` alone): vLLM builds no head
    and drops its weights. The check sees it."""
    from dflash_train.vllm.loader_check import check_folder

    folder = random_serving_folder("dspark", smollm2_path, tmp_path / "drafter")
    config = json.loads((folder / "config.json").read_text())
    del config["enable_confidence_head"], config["confidence_head_with_markov"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "checksums.json").unlink()  # those exports wrote no checksums either (the edit is on purpose)
    report = check_folder(folder, smollm2_path, vllm_python)
    assert not report["ok"]
    assert report["tensors"]["landed_nowhere"] == ["confidence_head.proj.bias", "confidence_head.proj.weight"]
    assert report["fields_wrong"] == ["has_confidence_head", "confidence_head_with_markov"]


def test_vllm_drafts_what_we_draft(vllm_python, smollm2_path, tmp_path):
    answers = write_answers(smollm2_path, tmp_path / "answers.jsonl")
    run, drafter, out = tmp_path / "run", tmp_path / "drafter", tmp_path / "eval"
    train_memorized("dflash", smollm2_path, answers, run)
    assert main(["export", str(run), str(drafter), "--dtype", "float32"]) == 0
    code = main(["eval", "--engine", "vllm", "--target", str(smollm2_path), "--drafter", str(drafter),
                 "--prompts", str(prompts_file(tmp_path / "prompts.txt")), "--max-new-tokens", str(NEW_TOKENS),
                 "--out", str(out)])
    report = json.loads((out / "eval.json").read_text())
    s = report["summary"]
    assert code == 0, s
    assert s["engine_lossless"] and s["engine_plain_equals_ours"] and s["engine_equals_ours"], s
    assert s["partings"] == [], s
    assert s["aligned_equal"] and s["aligned_steps_compared"] >= 12 and s["aligned_ends_consistent"], s
    for r in report["prompts"]:  # vLLM's steps are ours, one for one, to the last
        assert r["engine_accepted"] == r["ours_accepted"], r
        assert r["engine_own"]["drafts"] == len(r["ours_accepted"]) and r["counters_equal_request_metrics"], r
    assert s["engine_tau"] == s["ours_tau"] and s["engine_per_position"] == s["ours_per_position"], s
    assert s["engine_mean_acceptance_length"] == pytest.approx(s["ours_verified_tau"]), s
    accepted = [a for r in report["prompts"] for a in r["ours_accepted"]]
    assert sum(a > 0 for a in accepted) >= len(accepted) // 2, accepted  # a drafter that accepts
    assert s["ours_tau"] > 2.0, s
