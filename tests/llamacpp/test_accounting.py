"""llama.cpp's output read and booked by our rule (no llama.cpp needed): parsing, tau, alignment, refusals."""

from __future__ import annotations

import pytest
import torch

from dflash_train.eval.llamacpp import (
    NEAR_TIE_LOGITS,
    EngineStep,
    align,
    engine_tau,
    failed_checks,
    first_parting,
    kept_steps,
    nearest_tie,
    our_tau,
    parse_completion,
    parse_speculative,
    steps_before,
    tie_gap,
)
from dflash_train.llamacpp import SUPPORTED_TARGET_ARCHITECTURES, check_hf_target, check_target_architecture

# The issue's first prompt (DFlash, B = 8, -n 64): llama.cpp's steps and ours, as they were logged.
ENGINE = [0, 0, 6, 5, 7, 7, 2, 0, 4, 7, 7, 5, 1, 7]
OURS = [0, 6, 5, 7, 7, 2, 0, 4, 7, 7, 5, 7]


def _steps(accepted, drafted=None):
    drafted = drafted or [7] * len(accepted)
    return [EngineStep(a, n, 100 + i) for i, (a, n) in enumerate(zip(accepted, drafted))]


def _spec_log(accepted, drafted, tokens, seconds=1.5):
    lines = ["0.01.848.686 I common_speculative_impl_draft_dflash: - block_size=8, mask_token_id=3"]
    for i, (a, n) in enumerate(zip(accepted, drafted)):
        lines.append(f"0.02.{i:03d}.000 D accepted {a}/{n} draft tokens, the last target token is: ({200 + i})")
    lines += [f"0.03.298.674 I decoded {tokens:4d} tokens in {seconds:8.3f} seconds, speed: {tokens / seconds:8.3f} t/s",
              "0.03.298.730 I spec common_specu: statistics     draft-dflash: #calls(b,g,a) =    1     14     14, "
              "#gen drafts =     14, #acc drafts =    10, #gen tokens =     98, #acc tokens =    58, "
              "#mean acc len = 5.14, #acc rate/pos = (0.71, 0.64, 0.60), dur(b,g,a) = 0.007, 200.727, 0.009 ms"]
    return "\n".join(lines) + "\n"


def test_the_issues_first_prompt_booked_by_our_rule():
    """72 tokens in 14 steps is llama.cpp's 5.14; within -n 64, past its first step, 63 tokens in 12
    steps: 5.25, which is our decoder's 63 / 12 on the same prompt."""
    steps = _steps(ENGINE)
    assert sum(a + 1 for a in ENGINE) == 72 and round(72 / 14, 2) == 5.14
    booked = engine_tau(steps, kept_tokens=64)
    assert booked["steps"] == 12 and booked["tau"] == pytest.approx(63 / 12)
    assert booked["overrun_tokens"] == 8 and booked["overrun_steps"] == 1
    assert booked["first_step"] == {"accepted": 0, "drafted": 7}
    assert our_tau(64, len(OURS)) == pytest.approx(booked["tau"])
    assert sum(a + 1 for a in OURS) / len(OURS) == pytest.approx(5.75)  # the count before 2026-12-05


def test_alignment_between_the_two_ends():
    drafted = [7] * 12 + [1, 7]  # the step reaching -n drafted what was left of it
    aligned = align(_steps(ENGINE, drafted), OURS, n_draft=7)
    assert aligned["equal"] and aligned["compared_steps"] == 11  # not our last step, not the cut one
    assert aligned["end_steps"] == 1 and aligned["ends_consistent"]  # 1 of 1 drafted: min(7, 1)
    wrong = list(OURS)
    wrong[3] = 6
    broken = align(_steps(ENGINE, drafted), wrong, n_draft=7)
    assert not broken["equal"] and broken["first_difference"] == 3
    shortened = [7] * 5 + [3] * 9  # a step with a shortened draft ends the comparison
    assert align(_steps(ENGINE, shortened), OURS, n_draft=7)["compared_steps"] == 4



def test_a_step_ended_by_a_stop_token_is_compared_by_what_ours_kept():
    """Held-out prompt 21 (2026-12-05): our last step verified 2 drafts, the first of them the stop
    token; llama.cpp stops accepting at an accepted end-of-generation draft and books it as the step's
    own token: accepted 0. Ours kept 1 token at that step, 0 drafts before the stop token."""
    engine, ours = [0, 1, 0, 0], [1, 0, 2]
    assert not align(_steps(engine), ours, n_draft=7)["ends_consistent"]
    aligned = align(_steps(engine), ours, n_draft=7, stop_kept=0)
    assert aligned["equal"] and aligned["compared_steps"] == 2 and aligned["ends_consistent"]
    assert not align(_steps(engine), ours, n_draft=7, stop_kept=1)["ends_consistent"]


def test_alignment_stops_where_the_decodes_parted():
    parted = list(ENGINE)
    parted[6] = 3  # our step 5 decoded other tokens in the engine (after a near-tie)
    assert not align(_steps(parted), OURS, n_draft=7)["equal"]
    cut = align(_steps(parted), OURS, n_draft=7, limit=5)
    assert cut["equal"] and cut["compared_steps"] == 5 and cut["end_steps"] == 0 and cut["cut_at_divergence"]
    # OURS = [0, 6, 5, ...]: token 0 is the prefill's, step 0 makes token 1, step 1 tokens 2..8, step 2 9..14
    assert [steps_before(OURS, t) for t in (1, 2, 8, 9, 15)] == [0, 1, 1, 2, 3]


VOCAB = ["E", "cho", "ch", "oes", " of", " Death", " Eternity", "es"]


def _decode(tokens):
    return "".join(VOCAB[t] for t in tokens)


def test_a_parting_is_found_where_the_tokens_part_and_measured_by_its_gap():
    """The case of held-out prompt 8: ours "E" "cho" " of", llama.cpp's plain decode "E" "ch" "oes" " of":
    the texts part at our third token, the tokens at the second, at a gap of 0.0006 logits."""
    ours, engine_text = [0, 1, 4, 5], "Echoes of Eternity"
    assert first_parting(engine_text, ours, _decode) == 2  # "Echo" still begins "Echoes"
    assert first_parting("Echo of Death", ours, _decode) is None
    logits = torch.full((len(VOCAB),), -5.0)
    logits[1], logits[2] = 14.0897, 14.0891  # "cho" over "ch"
    gap, piece = tie_gap(logits, 1, engine_text[len("E"):], _decode)
    assert piece == "ch" and gap == pytest.approx(0.0006, abs=1e-4) and gap <= NEAR_TIE_LOGITS
    logits[2] = 12.0  # a whole-logit gap: a decode error, not a tie
    gap, _ = tie_gap(logits, 1, engine_text[len("E"):], _decode)
    assert gap == pytest.approx(2.0897, abs=1e-3) and gap > NEAR_TIE_LOGITS
    assert tie_gap(logits, 1, " Death", _decode, top=2) == (None, None)  # none of the top 2 fits its text



def test_the_parting_is_placed_at_the_token_with_the_nearest_tie():
    """Texts part at our token 2 (" of" against "es"), the tokens at token 1 ("cho" against "ch"):
    the lookback finds token 1 and its 0.0006 gap, not token 2's whole logits."""
    ours, engine_text = [0, 1, 4, 5], "Echoes of Eternity"
    rows = torch.full((3, len(VOCAB)), -5.0)
    rows[1, 1], rows[1, 2] = 14.0897, 14.0891  # token 1: "cho" over "ch"
    rows[2, 4], rows[2, 7] = 9.67, 3.0  # token 2: " of" over "es"
    found = nearest_tie(rows, ours, engine_text, _decode, k=2)
    assert found["token"] == 1 and found["engine"] == "ch" and found["near_tie"]
    assert found["gap"] == pytest.approx(0.0006, abs=1e-4)
    rows[1, 2] = 10.0  # no tie anywhere: the smallest gap is reported, and it fails
    found = nearest_tie(rows, ours, engine_text, _decode, k=2)
    assert found["token"] == 1 and found["gap"] == pytest.approx(4.0897, abs=1e-3) and not found["near_tie"]
    lost = nearest_tie(rows, ours, "Exit", _decode, k=0)  # no token of ours goes on with the engine's text
    assert lost == {"token": 0, "ours": "E", "engine": None, "gap": None, "near_tie": False}

def test_near_tie_partings_are_reported_not_failed():
    summary = {"engine_lossless": False, "engine_plain_equals_ours": False, "aligned_equal": True,
               "aligned_ends_consistent": True, "partings_near_ties": True}
    assert failed_checks(summary) == []
    assert failed_checks({**summary, "partings_near_ties": False}) == ["engine_lossless", "engine_plain_equals_ours"]
    assert failed_checks({**summary, "aligned_equal": False}) == ["aligned_equal"]
    no_reference = {k: v for k, v in summary.items() if k != "partings_near_ties"}
    assert failed_checks(no_reference) == ["engine_lossless", "engine_plain_equals_ours"]


def test_kept_steps_cuts_the_last_step():
    assert kept_steps([3, 3, 3], 7) == (3, [3, 3, 1])
    assert kept_steps([3, 3, 3], 6) == (2, [3, 3])
    assert kept_steps([3], 0) == (0, [])


def test_parse_speculative_reads_steps_text_and_statistics():
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    stdout = "\n\n" + prompt + "Hello there.\n\n\n\n"
    run = parse_speculative(stdout, _spec_log(ENGINE, [7] * 14, 72), prompt)
    assert run.text == "Hello there."
    assert [s.accepted for s in run.steps] == ENGINE and run.steps[0].last_token == 200
    assert run.tokens == 72 and run.seconds == pytest.approx(1.5)
    assert run.mean_acc_len == pytest.approx(5.14) and run.acc_rate_per_pos == [0.71, 0.64, 0.6]
    with pytest.raises(ValueError, match="does not repeat the prompt"):
        parse_speculative("\n\nother\n\n\n\n", _spec_log(ENGINE, [7] * 14, 72), prompt)
    with pytest.raises(ValueError, match="accepted A/N"):
        parse_speculative(stdout, "nothing logged\n", prompt)


def test_parse_completion_reads_text_tokens_and_time():
    stderr = ("0.00.715.426 D tokens: [ '<|im_start|>':1, 'user':4093, '\n':198 ]\n"
              "0.01.950.871 I common_perf_print:    samplers time =       0.24 ms /    11 tokens\n"
              "0.01.950.892 I common_perf_print: prompt eval time =     269.98 ms /     3 tokens\n"
              "0.01.950.893 I common_perf_print:        eval time =     955.26 ms /     7 runs\n")
    run = parse_completion("\nThe answer is 4. [end of text]\n\n\n", stderr)
    assert run.text == "The answer is 4." and run.ended_by_stop
    assert run.prompt_ids == [1, 4093, 198] and run.tokens == 8 and run.runs == 7
    assert run.seconds == pytest.approx(0.95526)
    budget = parse_completion("\n\nThe answer\n\n", stderr)  # ended by -n, its text starting with a newline
    assert budget.text == "\nThe answer" and not budget.ended_by_stop


def test_unsupported_target_is_one_line_up_front():
    assert "llama" in SUPPORTED_TARGET_ARCHITECTURES and "qwen3" in SUPPORTED_TARGET_ARCHITECTURES
    check_target_architecture("llama", "t.gguf")
    with pytest.raises(ValueError) as err:
        check_target_architecture("qwen2", "t.gguf")
    assert "\n" not in str(err.value) and "'qwen2'" in str(err.value) and "layer inputs" in str(err.value)
    with pytest.raises(ValueError, match="Qwen2ForCausalLM"):
        check_hf_target({"architectures": ["Qwen2ForCausalLM"]}, "config.json")
    check_hf_target({"architectures": ["SomethingNew"]}, "config.json")  # unknown here: checked on its GGUF


def test_export_gguf_refuses_an_unsupported_target_before_writing(tmp_path, capsys):
    """``export --gguf`` reads the target GGUF first: a target whose llama.cpp graph gives a drafter no
    layer inputs is one line naming it, and nothing is written."""
    import json

    import gguf
    from safetensors.torch import save_file
    from testkit import tiny_drafter, tiny_qwen3

    from dflash_train.cli import main
    from dflash_train.models.target import Target
    from dflash_train.run_folder import CHECKSUMS, file_checksums

    ckpt = tmp_path / "run" / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    drafter, cfg = tiny_drafter(Target(tiny_qwen3()))
    (ckpt / "drafter_config.json").write_text(json.dumps(cfg.to_dict()))
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, str(ckpt / "drafter.safetensors"))
    (ckpt / CHECKSUMS).write_text(json.dumps(file_checksums(ckpt)))
    (ckpt / "COMPLETE").write_text("")
    for arch, expected in (("qwen2", "'qwen2'"), ("qwen3", "vocab_size")):  # unsupported; a different model
        fake = tmp_path / f"{arch}.gguf"
        writer = gguf.GGUFWriter(str(fake), arch)
        writer.add_array("tokenizer.ggml.tokens", ["a", "b"])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert main(["export", str(tmp_path / "run"), str(tmp_path / "out"), "--gguf", str(fake)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err
        assert not (tmp_path / "out").exists()


def test_eval_without_llamacpp_says_how_to_build_it(tmp_path, capsys, monkeypatch):
    from dflash_train.cli import main

    monkeypatch.delenv("DFLASH_LLAMA_CPP", raising=False)
    code = main(["eval", "--engine", "llama.cpp", "--llama-cpp", str(tmp_path / "nowhere"), "--target", "T",
                 "--drafter", "D", "--prompts", "heldout"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "dflash-train llama-cpp build" in err[0], err
