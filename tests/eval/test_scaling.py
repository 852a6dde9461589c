"""The tau-vs-compute fit against points on a known line."""

import json
import math

import pytest

from dflash_train.eval.scaling import fit_log_linear, main


def test_fit_recovers_a_known_log_linear_law_and_inverts_it():
    minutes = [0.5, 1, 2, 8, 15]
    taus = [1.2 + 0.4 * math.log10(m) for m in minutes]
    fit = fit_log_linear(minutes, taus)
    assert fit.intercept == pytest.approx(1.2) and fit.slope == pytest.approx(0.4) and fit.r2 == pytest.approx(1.0)
    assert fit.minutes_for(2.0) == pytest.approx(10 ** 2)  # (2.0 - 1.2) / 0.4 = 2 decades
    assert fit_log_linear([1, 2], [2.0, 1.5]).minutes_for(3.0) is None  # no growth: no cost to report
    with pytest.raises(ValueError, match="two different"):
        fit_log_linear([1, 1], [1.0, 2.0])


def test_cli_reads_eval_reports_on_a_prompt_range_and_writes_png_and_json(tmp_path, capsys):
    points = []
    for minutes, lengths in [(1, [[2, 2], [9]]), (10, [[3, 3], [9]])]:
        path = tmp_path / f"e{minutes}.json"
        path.write_text(json.dumps({"prompts": [{"tau": sum(a) / len(a), "kept_lengths": a, "acceptance_lengths": a} for a in lengths]}))
        points += ["--point", f"{minutes}={path}"]
    out, js = tmp_path / "c.png", tmp_path / "c.json"
    args = ["--prompts", "1-1", "--goal", "4", "--goal", "3.5", "--out", str(out), "--json", str(js)]
    assert main(points + args) == 0
    result = json.loads(js.read_text())
    assert [p["tau"] for p in result["points"]] == [2.0, 3.0]  # prompt 2 (the 9s) is outside 1-1
    assert result["gpu_minutes_for_goal"] == pytest.approx(100.0)  # the first goal
    assert [g["gpu_minutes"] for g in result["goals"]] == pytest.approx([100.0, 10 ** 1.5])
    assert out.stat().st_size > 1000
    assert main(["--point", "0=x.json"]) == 2
    assert "GPU_MINUTES > 0" in capsys.readouterr().err


def _report(path, lengths):
    path.write_text(json.dumps({"prompts": [{"tau": sum(a) / len(a), "kept_lengths": a, "acceptance_lengths": a} for a in lengths]}))
    return path


def test_series_get_their_own_lines_and_the_first_one_is_reported_on_top(tmp_path, capsys):
    a1, a10 = _report(tmp_path / "a1.json", [[2]]), _report(tmp_path / "a10.json", [[3]])
    b1, b10 = _report(tmp_path / "b1.json", [[2.5]]), _report(tmp_path / "b10.json", [[4]])
    js = tmp_path / "c.json"
    args = ["--point", f"old@1={a1}", "--point", f"new recipe@10={b10}", "--point", f"old@10={a10}",
            "--point", f"new recipe@1={b1}", "--goal", "5", "--out", str(tmp_path / "c.png"), "--json", str(js)]
    assert main(args) == 0
    result = json.loads(js.read_text())
    old, new = result["series"]
    assert (old["label"], new["label"]) == ("old", "new recipe")
    assert [p["tau"] for p in new["points"]] == [2.5, 4.0]  # sorted by compute within a series
    assert old["goals"][0]["gpu_minutes"] == pytest.approx(10 ** 3)  # 2 + 1 per decade
    assert new["goals"][0]["gpu_minutes"] == pytest.approx(10 ** (2.5 / 1.5))
    assert result["fit"] == old["fit"] and result["gpu_minutes_for_goal"] == old["goals"][0]["gpu_minutes"]
    assert "new recipe: fit" in capsys.readouterr().out
    # a second series with a single budget is drawn as points, without a line
    assert main(["--point", f"1={a1}", "--point", f"10={a10}", "--point", f"one@3={b1}", "--out",
                 str(tmp_path / "d.png"), "--json", str(js)]) == 0
    assert json.loads(js.read_text())["series"][1]["fit"] is None
    # the first series needs two budgets
    assert main(["--point", f"x@1={a1}", "--point", f"y@1={b1}", "--point", f"y@10={b10}"]) == 2
    assert "series x: a fit needs" in capsys.readouterr().err
