"""``dflash-train eval`` end to end on a tiny model folder, prompt reading, lossless verdicts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from serving_helpers import write_serving_folder
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.cli import main
from dflash_train.data.prompts import read_prompts, record_prompt
from dflash_train.decoding.speculative import GenResult
from dflash_train.eval.evaluate import compare_greedy, evaluate, format_table
from dflash_train.models.target import Target

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("eval_cli")
    model = tiny_qwen3(hidden=32, vocab=49152, tie=True)
    model.save_pretrained(root / "target")
    AutoTokenizer.from_pretrained(SMOLLM2).save_pretrained(root / "target")
    target = Target(model)
    drafter, cfg = tiny_drafter(target, num_layers=2, block_size=4)
    write_serving_folder(drafter, cfg, root / "drafter")
    (root / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
        {"conversations": [{"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "Red."}]},
        {"prompt": "Say hello."},
    ]) + "\n")
    (root / "prompts.txt").write_text("Count to three.\n\nWrite a haiku.\n")
    return root


@pytest.mark.parametrize("prompts", ["prompts.jsonl", "prompts.txt"])
def test_eval_cli_end_to_end(folders, tmp_path, capsys, prompts):
    out = tmp_path / "out"
    rc = main(["eval", "--target", str(folders / "target"), "--drafter", str(folders / "drafter"),
               "--prompts", str(folders / prompts), "--max-new-tokens", "12", "--device", "cpu",
               "--dtype", "float32", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "eval.json").read_text())
    assert (out / "eval.png").stat().st_size > 1000
    assert report["num_prompts"] == (3 if prompts.endswith("jsonl") else 2)
    assert report["lossless"] == {**report["lossless"], "checked": True, "ok": True, "failed_prompts": []}
    assert report["block_size"] == 4 and report["mean_tau"] >= 1.0
    assert len(report["tau_per_prompt"]) == report["num_prompts"]
    assert sum(report["acceptance_histogram"].values()) == report["num_verify_steps"]
    assert report["speedup"] > 0 and report["target_decode_tokens_per_s"] > 0
    # tau counts kept tokens: every new token but the prefill's, over the verify steps
    kept = sum(p["new_tokens"] - 1 for p in report["prompts"])
    assert report["mean_tau"] == pytest.approx(kept / report["num_verify_steps"])
    assert all(sum(p["kept_lengths"]) == p["new_tokens"] - 1 for p in report["prompts"])
    assert "tau (kept tokens / verify step)" in capsys.readouterr().out
    assert report["engine"] == "static"  # auto: greedy runs on the static engine


def test_auto_engine_follows_temperature():
    from dflash_train.eval.evaluate import resolve_engine

    assert resolve_engine("auto", 0.0) == "static" and resolve_engine("auto", 0.7) == "hf"
    assert resolve_engine("hf", 0.0) == "hf" and resolve_engine("static", 0.0) == "static"


@pytest.mark.parametrize("engine", ["hf", "static"])
def test_eval_cli_reports_lossless_failure(folders, tmp_path, monkeypatch, capsys, engine):
    import dflash_train.eval.evaluate as ev
    from dflash_train.decoding.static import StaticDecoder

    def corrupt(real):
        def broken(*args, **kwargs):
            result = real(*args, **kwargs)
            result.tokens[3] = (result.tokens[3] + 1) % 49152
            return result
        return broken

    if engine == "hf":
        monkeypatch.setattr(ev, "speculative_generate", corrupt(ev.speculative_generate))
    else:
        monkeypatch.setattr(StaticDecoder, "speculative", corrupt(StaticDecoder.speculative))
    rc = main(["eval", "--target", str(folders / "target"), "--drafter", str(folders / "drafter"),
               "--prompts", str(folders / "prompts.txt"), "--max-new-tokens", "8", "--device", "cpu",
               "--limit", "1", "--engine", engine, "--out", str(tmp_path / "o")])
    assert rc == 1
    assert "LOSSLESS CHECK FAILED on prompt 0" in capsys.readouterr().err
    report = json.loads((tmp_path / "o" / "eval.json").read_text())
    assert report["lossless"]["ok"] is False and report["lossless"]["per_prompt"][0]["diverged_at"] == 3


def test_evaluate_api_cheap_mode(folders):
    target = Target(tiny_qwen3(hidden=32, vocab=49152, tie=True))
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=4)
    drafter.train()
    report = evaluate(target, drafter, [[1, 2, 3], torch.tensor([4, 5])], max_new_tokens=6, baseline=False,
                      block_size=3)
    assert drafter.training  # mode restored
    assert report["lossless"] == {"checked": False, "ok": None} and "speedup" not in report
    assert report["block_size"] == 3 and len(report["per_position_acceptance"]) == 2
    assert "tau (kept tokens / verify step)" in format_table(report)


def test_compare_greedy_tolerance():
    plain = GenResult([5, 6, 7], topk_values=torch.tensor([[9.0, 1.0], [4.0, 3.8], [2.0, 1.0]]),
                      topk_ids=torch.tensor([[5, 1], [6, 9], [7, 1]]))
    assert compare_greedy([5, 6, 7], plain, 0.0)["ok"]
    near_tie = compare_greedy([5, 9, 3], plain, 0.5)
    assert near_tie["ok"] and near_tie["diverged_at"] == 1 and near_tie["top2_gap"] == pytest.approx(0.2)
    assert not compare_greedy([5, 9, 3], plain, 0.0)["ok"]  # float32: no tolerance
    assert not compare_greedy([5, 9, 3], plain, 0.1)["ok"]
    assert not compare_greedy([1, 6, 7], plain, 0.5)["ok"]  # a gap of 8 logits is a real error
    assert not compare_greedy([5, 4, 7], plain, 0.5)["ok"]  # not even in the plain top-k
    assert not compare_greedy([5, 6], plain, 0.5)["ok"]  # stopped early


def test_prompt_extraction(tmp_path):
    conv = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                         {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
                         {"role": "assistant", "content": "d"}]}
    assert [m["content"] for m in record_prompt(conv, "x")] == ["s", "a", "b", "c"]
    assert record_prompt({"prompt": "hi"}, "x") == [{"role": "user", "content": "hi"}]
    sharegpt = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}], "system": "S"}
    assert record_prompt(sharegpt, "x") == [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]
    tool = {"conversations": [{"from": "human", "value": "q"}, {"from": "function_response", "value": "t"},
                              {"from": "gpt", "value": "r"}]}  # the data readers' role table
    assert [m["role"] for m in record_prompt(tool, "x")] == ["user", "tool"]
    with pytest.raises(ValueError, match=r"f:1: field 'messages\[0\].role': unknown_role"):
        record_prompt({"messages": [{"role": "bogus", "content": "x"}]}, "f:1")
    with pytest.raises(ValueError, match="no 'messages'"):
        record_prompt({"text": "x"}, "f:1")
    with pytest.raises(ValueError, match="empty"):
        record_prompt({"messages": [{"role": "assistant", "content": "x"}]}, "f:1")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_prompts(bad)
    assert len(read_prompts(bad, limit=1)) == 1


def test_evaluate_static_engine_reports_like_hf():
    """The static engine reports what the reference loops report (same tokens, same tau)."""
    target = Target(tiny_qwen3(vocab=128))
    rng = random.Random(5)
    drafter = tiny_drafter(target, block_size=4, seed=4)[0]
    ids = [[rng.randrange(127) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    hf = evaluate(target, drafter, ids, max_new_tokens=20, stop_token_ids=[], engine="hf")
    static = evaluate(target, drafter, ids, max_new_tokens=20, stop_token_ids=[], engine="static")
    assert static["engine"] == "static" and static["lossless"]["ok"]
    for key in ("mean_tau", "tau_per_prompt", "num_verify_steps"):
        assert static[key] == hf[key], key
    assert static["static_compile"] is False and static["static_compiled_steps"] == []  # CPU default
    # the time split per verify step, against one plain step
    steps = static["num_verify_steps"]
    assert static["ms_per_verify_step"] == pytest.approx(1e3 * static["spec_verify_time_s"] / steps)
    assert static["ms_per_draft_step"] == pytest.approx(1e3 * static["spec_draft_time_s"] / steps)
    assert static["ms_per_plain_step"] == pytest.approx(1e3 / static["target_decode_tokens_per_s"])
    assert static["break_even_tau"] == pytest.approx(
        (static["ms_per_verify_step"] + static["ms_per_draft_step"]) / static["ms_per_plain_step"])
    with pytest.raises(ValueError, match="greedily only"):
        evaluate(target, drafter, ids, max_new_tokens=4, temperature=0.7, baseline=False, engine="static")


def test_eval_options_are_checked_and_exclusive(tiny_target):
    """``evaluate`` takes an EvalOptions or its fields (not both); bad values are one clear error."""
    from dflash_train.eval.evaluate import EvalOptions, evaluate

    with pytest.raises(ValueError, match="engine must be"):
        EvalOptions(engine="fast")
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        EvalOptions(max_new_tokens=0)
    with pytest.raises(ValueError, match="either an EvalOptions or its fields"):
        evaluate(tiny_target, None, [[1, 2]], EvalOptions(), baseline=False)



def test_compile_option_defaults_to_cuda_only():
    from dflash_train.eval.cli import _compile_option

    assert _compile_option(None, "default", "cuda:0") == "default" and _compile_option(None, "default", "cpu") is False
    assert _compile_option(False, "default", "cuda") is False
    assert _compile_option(True, "max-autotune-no-cudagraphs", "cpu") == "max-autotune-no-cudagraphs"


def test_compile_steps_option_is_parsed_and_checked():
    """``--compile-steps``: a comma list of the static steps to compile (default: the draft step)."""
    from dflash_train.cli import build_parser
    from dflash_train.eval.cli import _compile_steps

    assert _compile_steps(build_parser().parse_args(["eval", "--target", "t", "--drafter", "d",
                                                     "--prompts", "p"]).compile_steps) == ("draft",)
    assert _compile_steps(" verify,draft ") == ("verify", "draft")
    with pytest.raises(ValueError, match="--compile-steps"):
        _compile_steps("draft,prefill")
    with pytest.raises(ValueError, match="--compile-steps"):
        _compile_steps(",")
