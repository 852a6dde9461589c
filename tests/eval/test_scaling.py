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
        path.write_text(json.dumps({"prompts": [{"tau": sum(a) / len(a), "acceptance_lengths": a} for a in lengths]}))
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
