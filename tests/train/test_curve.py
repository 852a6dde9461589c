"""``python -m dflash_train.train.curve``: the training-curve PNG from metrics.jsonl."""

from __future__ import annotations

import json

from dflash_train.train.curve import main, read_curve


def _write_run(folder, rows):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_reads_both_series_and_writes_a_png(tmp_path):
    run = _write_run(tmp_path / "run", [
        {"step": 0, "tau": 1.0},
        {"step": 50, "loss": 9.0, "expected_acceptance": 1.2, "tokens_per_s": 10.0},
        {"step": 100, "loss": 7.0, "expected_acceptance": 1.9},
        {"step": 100, "tau": 1.3},
    ])
    series = read_curve(run)
    assert series["tau"] == [(0, 1.0), (100, 1.3)]
    assert series["expected_acceptance"] == [(50, 1.2), (100, 1.9)]
    assert series["loss"] == [(50, 9.0), (100, 7.0)]
    out = tmp_path / "curve.png"
    assert main([str(run), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_names_the_file_and_line(tmp_path, capsys):
    run = _write_run(tmp_path / "bad", [{"step": 1, "loss": 2.0}])
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write("{not json\n")
    assert main([str(run), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl:2" in err
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "y.png")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_every_run_is_drawn(tmp_path, monkeypatch):
    """Five runs, five loss lines (a fixed four-colour list once dropped the fifth silently)."""
    from matplotlib.figure import Figure

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    runs = [_write_run(tmp_path / f"r{i}", [{"step": 10, "loss": 5.0 - i}, {"step": 20, "loss": 4.0 - i}])
            for i in range(5)]
    assert main([str(r) for r in runs] + ["--out", str(tmp_path / "c.png")]) == 0
    loss_axis = saved[0].axes[1]
    assert sorted(line.get_label() for line in loss_axis.get_lines()) == [f"r{i}" for i in range(5)]
    assert len({line.get_color() for line in loss_axis.get_lines()}) == 5
