"""The one mechanism that prints errors: ``dflash_train.cli.main`` prints a ValueError (every
``files.UserFacingError``) or an OSError as one line, and a bad flag in one line naming it."""

from __future__ import annotations

import argparse
import errno

import pytest

from dflash_train import cli
from dflash_train.cli_types import (
    fraction,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    unit_interval,
)


def _main_with(func, capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["train", "cpu-demo"])
    args.func = func
    real = cli.build_parser
    try:
        cli.build_parser = lambda: type("P", (), {"parse_args": lambda self, argv: args})()
        code = cli.main([])
    finally:
        cli.build_parser = real
    return code, capsys.readouterr().err


@pytest.mark.parametrize("err", [
    OSError(errno.ENOSPC, "No space left on device", "/data/run/metrics.jsonl"),
    OSError(errno.EIO, "Input/output error"),
    PermissionError(errno.EACCES, "Permission denied", "/x/y"),
])
def test_an_unexplained_os_error_is_one_line(err, capsys):
    def fail(args):
        raise err

    code, text = _main_with(fail, capsys)
    assert code == 2 and len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert text.startswith("dflash-train train: error: ") and "[Errno" not in text
    if err.filename:
        assert err.filename in text


def test_a_broken_config_through_the_cli_is_one_line(tmp_path, capsys):
    bad = tmp_path / "job.yaml"
    bad.write_bytes("train: {max_steps: 3}\n".encode("utf-16"))
    assert cli.main(["train", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "job.yaml" in err and "UTF-16" in err


def test_a_flag_out_of_range_is_one_line_naming_it(capsys):
    parser = cli.OneLineParser(prog="dflash-train")
    sub = parser.add_subparsers()
    p = sub.add_parser("eval")
    p.add_argument("--limit", type=positive_int)
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["eval", "--limit", "0"])
    err = capsys.readouterr().err.strip()
    assert caught.value.code == 2 and len(err.splitlines()) == 1
    assert err == "dflash-train eval: error: argument --limit: must be an integer >= 1, got 0 (see dflash-train eval --help)"


@pytest.mark.parametrize(("kind", "good", "bad"), [
    (positive_int, ["1", "7"], ["0", "-1", "1.5", "x", ""]),
    (nonneg_int, ["0", "3"], ["-1", "nan"]),
    (positive_float, ["1e-3", "2"], ["0", "-1", "nan", "inf", "x"]),
    (nonneg_float, ["0", "0.5"], ["-0.1", "nan", "-inf"]),
    (fraction, ["1", "0.95"], ["0", "1.01", "nan"]),
    (unit_interval, ["0", "1", "0.5"], ["-0.01", "1.5", "inf"]),
])
def test_validators_accept_and_refuse(kind, good, bad):
    for text in good:
        kind(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)
