"""Every numeric flag of the eval, replay, compare, scaling and benchmark CLIs is range-checked:
a bad value ends the command with one line naming the flag (argparse exit status 2), before
any file or model is read."""

from __future__ import annotations

import argparse

import pytest

from dflash_train.cli_types import at_least, float_at_least, nonnegative_float, positive_int, probability

EVAL = ["eval", "--target", "t", "--drafter", "d", "--prompts", "p"]


def _refused(run, argv, flag, capsys):
    """``run(argv)`` exits 2 and its last stderr line names ``flag`` (argparse's one error line)."""
    with pytest.raises(SystemExit) as exc:
        run(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}" in last and "must be" in last, last
    return last


def test_validators_accept_the_range_and_name_the_rule():
    assert positive_int("3") == 3 and at_least(2)("2") == 2 and probability("1") == 1.0
    assert nonnegative_float("0") == 0.0 and float_at_least(1.0)("1.5") == 1.5
    for parse, text in [(positive_int, "0"), (positive_int, "-1"), (positive_int, "1.5"), (at_least(2), "1"),
                        (probability, "0"), (probability, "1.01"), (nonnegative_float, "-0.1"),
                        (nonnegative_float, "nan"), (nonnegative_float, "inf"), (float_at_least(1.0), "0.9")]:
        with pytest.raises(argparse.ArgumentTypeError, match="must be"):
            parse(text)


@pytest.mark.parametrize("flag,value", [("--limit", "0"), ("--limit", "-2"), ("--max-new-tokens", "0"),
                                        ("--block-size", "0"), ("--temperature", "-1"), ("--top-p", "0"),
                                        ("--top-p", "1.5"), ("--seed", "-1"), ("--temperature", "nan")])
def test_eval_refuses_out_of_range_numbers(flag, value, capsys):
    """``--limit 0`` once evaluated every prompt and printed PASS: now it is refused."""
    from dflash_train.cli import main

    line = _refused(main, [*EVAL, flag, value], flag, capsys)
    assert value in line


def test_read_prompts_refuses_a_limit_below_one(tmp_path):
    """The library side of ``--limit 0``: 0 is not "all" (None is)."""
    from dflash_train.data.prompts import read_prompts

    path = tmp_path / "p.txt"
    path.write_text("a\nb\n")
    assert len(read_prompts(path)) == 2 and len(read_prompts(path, limit=1)) == 1
    with pytest.raises(ValueError, match="limit must be >= 1"):
        read_prompts(path, limit=0)


@pytest.mark.parametrize("flag,value", [("--limit", "0"), ("--max-new-tokens", "0"), ("--block-size", "0")])
def test_replay_refuses_out_of_range_numbers(flag, value, capsys):
    from dflash_train.eval.replay import main

    _refused(main, ["--target", "t", "--drafter", "d", "--prompts", "p", "--out", "o", flag, value], flag, capsys)


def test_compare_and_scaling_refuse_out_of_range_numbers(capsys):
    from dflash_train.eval.compare import main as compare_main
    from dflash_train.eval.scaling import main as scaling_main

    _refused(compare_main, ["a.json", "b.json", "--min-se", "-1"], "--min-se", capsys)
    _refused(scaling_main, ["--point", "1=a.json", "--goal", "0.5"], "--goal", capsys)


@pytest.mark.parametrize("flag,value", [("--replays", "0"), ("--prompt-len", "0"), ("--new-tokens", "-3"),
                                        ("--block-size", "1"), ("--drafter-layers", "0"),
                                        ("--time-budget-s", "0")])
def test_decode_steps_bench_refuses_out_of_range_numbers(flag, value, capsys):
    from dflash_train.bench.decode_steps import main

    _refused(main, ["--target", "t", flag, value], flag, capsys)


@pytest.mark.parametrize("flag,value", [("--n", "0"), ("--max-new", "0"), ("--batch", "0"), ("--hf-batch", "0"),
                                        ("--check", "-1")])
def test_generate_bench_refuses_out_of_range_numbers(flag, value, capsys):
    from dflash_train.bench.generate import main

    _refused(main, [flag, value], flag, capsys)


def test_benchmarks_register_as_subcommands():
    """Each benchmark exposes ``add_arguments`` (for a ``dflash-train`` sub-command) and ``main(argv)``."""
    from dflash_train.bench import decode_steps, generate

    for module in (decode_steps, generate):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        assert parser.parse_args(["--target", "t"]).target == "t"
    with pytest.raises(SystemExit, match="--modes"):
        generate.main(["--modes", "cudagraph:fast"])
