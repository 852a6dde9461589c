"""Paired per-prompt comparison of eval reports, against hand-computed numbers."""

import json
import math

import pytest

from dflash_train.eval.compare import compare, main, parse_range


def _report(per_prompt_lengths):
    """Steps that kept all they accepted: kept tokens per step = acceptance per step."""
    prompts = [{"tau": sum(a) / len(a), "kept_lengths": a, "acceptance_lengths": a} for a in per_prompt_lengths]
    return {"prompts": prompts}


def test_old_reports_are_recounted_on_kept_tokens_and_a_cut_last_step_counts_what_it_kept():
    """A report from before kept_lengths existed: its per-prompt tau and acceptance as verified
    counted the cut drafts of the last step; compare recounts from new_tokens (the prefill's token
    excluded), which equals counting kept_lengths."""
    old = {"prompts": [{"tau": 4.0, "new_tokens": 9, "acceptance_lengths": [3, 5]},  # kept all: 3 + 5 = 9 - 1
                       {"tau": 2.0, "new_tokens": 4, "acceptance_lengths": [2, 2]}]}
    new = {"prompts": [{"tau": 4.0, "kept_lengths": [3, 5], "acceptance_lengths": [3, 5]},
                       {"tau": 1.5, "kept_lengths": [2, 1], "acceptance_lengths": [2, 2]}]}
    row = compare(old, new, "v", parse_range("1-2"))
    assert row.base_tau == pytest.approx((8 + 3) / 4)  # not (3 + 5 + 2 + 2) / 4: one cut token not kept
    assert row.variant_tau == pytest.approx((8 + 3) / 4)
    assert row.mean_diff == pytest.approx(0.0)
    with pytest.raises(ValueError, match="cannot be counted"):
        compare({"prompts": [{"tau": 2.0, "acceptance_lengths": [2]}]}, new, "v", parse_range("1-1"))


def test_paired_difference_mean_stderr_wins_and_step_weighted_tau():
    base = _report([[1, 1], [2, 2, 2, 2], [1, 3]])  # per-prompt tau 1, 2, 2
    variant = _report([[2, 2], [2, 2, 2, 2], [3, 3]])  # 2, 2, 3
    row = compare(base, variant, "v", parse_range("1-3"))
    diffs = [1.0, 0.0, 1.0]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert row.mean_diff == pytest.approx(mean)
    assert row.stderr == pytest.approx(sd / math.sqrt(3))
    assert (row.wins, row.n) == (2, 3)
    assert row.base_tau == pytest.approx(14 / 8)  # over all verify steps (mean of prompts: 5/3)
    assert row.variant_tau == pytest.approx(18 / 8)
    sub = compare(base, variant, "v", parse_range("2-3"))
    assert (sub.n, sub.prompts, sub.mean_diff) == (2, "2-3", pytest.approx(0.5))


def test_bad_range_and_short_report_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="FIRST-LAST"):
        parse_range("1:24")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report([[1], [2]])))
    b.write_text(json.dumps(_report([[1]])))
    assert main([str(a), str(b), "--prompts", "1-2"]) == 2
    assert "not all present" in capsys.readouterr().err
    (tmp_path / "c.json").write_text("{}")
    assert main([str(a), str(tmp_path / "c.json")]) == 2
    assert "no per-prompt results" in capsys.readouterr().err


def test_cli_writes_table_and_json(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report([[1], [2], [1]])))
    b.write_text(json.dumps(_report([[2], [2], [2]])))
    out = tmp_path / "rows.json"
    assert main([str(a), str(b), "--prompts", "1-2", "--prompts", "3-3", "--json", str(out)]) == 0
    assert "| +0.500 +- 0.500 | 1/2 |" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert [r["prompts"] for r in rows] == ["1-2", "3-3"] and rows[1]["mean_diff"] == 1.0


def test_choose_takes_the_largest_gain_above_the_threshold_and_skips_missing_reports(tmp_path, capsys):
    """--choose on a range: the biggest paired gain wins only above --min-se standard errors;
    --skip-missing counts a variant without a report instead of failing the whole comparison."""
    base, small, big, noisy = (tmp_path / f"{n}.json" for n in ("base", "small", "big", "noisy"))
    base.write_text(json.dumps(_report([[1], [1], [1], [1]])))
    small.write_text(json.dumps(_report([[1.1], [1.2], [1.1], [1.2]])))  # +0.15 +- 0.029
    big.write_text(json.dumps(_report([[1.2], [1.5], [1.1], [1.4]])))  # +0.30 +- 0.091
    noisy.write_text(json.dumps(_report([[3], [0.5], [0.6], [0.5]])))  # +0.15 +- 0.5: never chosen
    gone = tmp_path / "gone" / "eval.json"
    args = [str(base), str(small), str(big), str(noisy), str(gone), "--prompts", "1-4", "--choose", "1-4",
            "--skip-missing", "--json", str(tmp_path / "c.json")]
    assert main([*args, "--min-se", "3"]) == 0
    out = capsys.readouterr().out
    assert f"choice: {big}" in out and "skipped 1 variant(s) without a report" in out
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["choice"] == str(big) and result["skipped"] == [str(gone)] and len(result["rows"]) == 3
    assert main([*args, "--min-se", "4"]) == 0  # big is 3.3 s.e., small 5.2: the gain must clear the bar
    assert f"choice: {small}" in capsys.readouterr().out
    assert main([*args, "--min-se", "6"]) == 0
    assert "choice: base (no variant above 6 standard errors" in capsys.readouterr().out
    assert main(args[:-3]) == 2  # without --skip-missing the missing report fails, naming the file
    assert "gone" in capsys.readouterr().err
    assert main([str(base), str(small), "--prompts", "1-4", "--choose", "1-2"]) == 2
    assert "not one of the --prompts ranges" in capsys.readouterr().err
