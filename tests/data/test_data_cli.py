"""CLI: ``data inspect`` output, highlighting, and user-fixable errors as exit code 2."""

from __future__ import annotations

import argparse

from data_helpers import SMOLLM2, write_jsonl

from dflash_train.data import cli
from dflash_train.data.inspect import highlight

ROW = {"messages": [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi, how are you?"}]}


def test_register_adds_commands():
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "inspect", "--data", "x.jsonl", "--tokenizer", "t", "--index", "2"])
    assert args.func is cli.cmd_inspect and args.index == 2
    args = parser.parse_args(["regenerate", "--target", "t", "--data", "a", "--out", "o", "--no-thinking"])
    assert args.func is cli.cmd_regenerate and args.thinking is False


def test_inspect_prints_example_stats_and_report(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [ROW, ROW, "{oops"])
    rc = cli.main(["data", "inspect", "--data", str(data), "--tokenizer", str(SMOLLM2), "--block-size", "2",
                   "--cache-dir", str(tmp_path / "c"), "--no-color"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "<|im_start|>assistant\n[[Hi, how are you?<|im_end|>]]" in out
    assert "examples: 2" in out and "length histogram" in out and "malformed_json: 1" in out
    assert f"{data}:3" in out


def test_highlight_color(chatml_tok):
    ids = chatml_tok.encode("a b c", add_special_tokens=False)
    assert highlight(chatml_tok, ids, [0, 1, 1], color=True) == "a\x1b[1;32m b c\x1b[0m"


def test_user_errors_exit_2(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [ROW])
    assert cli.main(["data", "inspect", "--data", str(tmp_path / "missing.jsonl"),
                     "--tokenizer", str(SMOLLM2)]) == 2
    assert cli.main(["data", "inspect", "--data", str(data), "--tokenizer", str(SMOLLM2), "--index", "9",
                     "--block-size", "1", "--cache-dir", str(tmp_path / "c")]) == 2
    assert "out of range" in capsys.readouterr().err
    assert cli.main(["regenerate", "--target", str(tmp_path / "nope"), "--data", str(data),
                     "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "no such model folder" in capsys.readouterr().err
