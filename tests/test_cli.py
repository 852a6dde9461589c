"""The ``dflash-train`` command line as a whole: every user tool is a sub-command in the
grouped overview, every flag has help text, and every numeric flag refuses an out-of-range
value with one line naming the flag (issue 36 item 2, issue 39 item 4).

The tests walk the real parser tree, so a flag added later without help or without a
range-checked type fails here without anyone listing it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dflash_train import cli

# the sub-commands the README names; each must exist and sit in a group of the overview
USER_COMMANDS = ["train", "demo", "data", "regenerate", "export", "eval", "bench", "plan", "config", "compare",
                 "replay", "scaling", "curve", "bench-decode", "bench-generate", "prompts", "offline-data"]

def _subparsers(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for every parser of the tree, the top one included."""
    yield path, parser
    for action in _subparsers(parser):
        for name, child in action.choices.items():
            yield from walk(child, (*path, name))


PARSER = cli.build_parser()
LEAVES = [(path, p) for path, p in walk(PARSER) if path and not _subparsers(p)]


def _flag_actions():
    for path, parser in LEAVES:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            yield path, parser, action


def _name(action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def test_every_user_tool_is_a_subcommand_in_a_group():
    commands = {action.dest for sub in _subparsers(PARSER) for action in sub._choices_actions}
    assert set(USER_COMMANDS) <= commands, set(USER_COMMANDS) - commands
    grouped = [name for _, names, _ in cli.GROUPS for name in names]
    assert sorted(grouped) == sorted(set(grouped)), "a command is in two groups"
    assert set(grouped) == commands, f"in no group: {commands - set(grouped)}; unknown: {set(grouped) - commands}"
    text = PARSER.format_help()
    for name in commands:
        assert f"\n    {name} " in text, name


def test_every_action_has_help():
    missing = [f"dflash-train {' '.join(path)} {_name(a)}" for path, _, a in _flag_actions()
               if not a.help or not a.help.strip()]
    assert not missing, "flags without help text:\n" + "\n".join(missing)


def test_every_subcommand_help_renders():
    for path, parser in LEAVES:
        text = parser.format_help()
        assert text.startswith(f"usage: dflash-train {' '.join(path)}"), text[:80]


def test_train_help_lists_config_keys():
    train = dict(LEAVES)[("train",)]
    text = train.format_help()
    for key in ("target: path", "max_steps", "block_size", "min_supervised_tokens"):
        assert key in text, key


def _numeric(action) -> str | None:
    """'int' or 'float' for a flag whose value is a number (by its type or default)."""
    if action.nargs == 0 or action.choices is not None:
        return None
    kind = action.type
    if kind is int or (callable(kind) and getattr(kind, "__name__", "").startswith(("integer", "int"))):
        return "int"
    if kind is float or (callable(kind) and getattr(kind, "__name__", "").startswith(("number", "float"))):
        return "float"
    if kind is None and isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
        return "int" if isinstance(action.default, int) else "float"
    return None


NUMERIC = [(path, parser, a) for path, parser, a in _flag_actions() if _numeric(a)]


def test_the_numeric_walk_finds_the_flags_it_must():
    """A check of the check: the walk sees the flags issue 39 named (it would pass vacuously otherwise)."""
    found = {(" ".join(path), _name(a)) for path, _, a in NUMERIC}
    for item in [("plan", "--gpus"), ("plan", "--steps"), ("train", "--target-ranks"), ("train", "--drafter-ranks"),
                 ("data inspect", "--max-length"), ("regenerate", "--top-p"), ("bench", "--steps"),
                 ("curve", None), ("prompts", "--num-synthetic"), ("offline-data", "--limit"), ("eval", "--limit")]:
        if item[1] is not None:
            assert item in found, item
    assert len(found) >= 40


@pytest.mark.parametrize("path,parser,action", NUMERIC,
                         ids=[f"{' '.join(p)} {_name(a)}" for p, _, a in NUMERIC])
def test_numeric_flag_is_range_checked(path, parser, action):
    """Each numeric flag's type refuses -1 and nan (no numeric flag of the CLI means anything by them)."""
    assert action.type not in (int, float, None), f"{_name(action)}: plain {action.type} accepts any number"
    for bad in ("-1", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be"):
            action.type(bad)
    if _numeric(action) == "float":
        with pytest.raises(argparse.ArgumentTypeError, match="must be"):
            action.type("inf")


@pytest.mark.parametrize("argv,flag", [
    (["plan", "cpu-demo", "--gpus", "0"], "--gpus"),
    (["plan", "cpu-demo", "--gpus", "2", "--steps", "nan"], "--steps"),
    (["train", "cpu-demo", "--target-ranks", "-1"], "--target-ranks"),
    (["data", "inspect", "--data", "x", "--tokenizer", "t", "--max-length", "0"], "--max-length"),
    (["regenerate", "--target", "t", "--data", "d", "--out", "o", "--top-p", "nan"], "--top-p"),
    (["bench", "--steps", "0"], "--steps"),
    (["prompts", "--out", "o", "--max-seconds", "-5"], "--max-seconds"),
    (["offline-data", "--out", "o", "--limit", "0"], "--limit"),
    (["bench-decode", "--target", "t", "--block-size", "1"], "--block-size"),
])
def test_bad_value_answers_in_one_line_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {flag}: must be" in err[0], err


def test_module_entry_points_still_parse(tmp_path):
    """``python -m`` modules stay usable as internals: same flags through their own ``main``."""
    from dflash_train.data.builders import offline_data

    out = tmp_path / "d.jsonl"
    assert offline_data.main(["--out", str(out), "--limit", "3"]) == 0
    assert len(out.read_text().splitlines()) == 3
    assert cli.main(["offline-data", "--out", str(out), "--limit", "2"]) == 0
    assert len(out.read_text().splitlines()) == 2


def test_heldout_evaluation_says_what_it_does_per_prompt(tmp_path):
    """The step-0 evaluation was ~35 s of silence on 2 cores: now a start line and a line per prompt."""
    from types import SimpleNamespace

    from testkit import tiny_chat_target, tiny_drafter

    from dflash_train.train.heldout import HeldoutEvaluator

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the capital of France?\nWrite a haiku about the sea.\nName a color.\n")
    target = tiny_chat_target(Path(__file__).resolve().parents[1] / "assets" / "smollm2")
    drafter, _ = tiny_drafter(target, block_size=4)
    lines: list[str] = []
    trainer = SimpleNamespace(target=target, drafter=drafter, ranks=SimpleNamespace(is_main=True),
                              counters=SimpleNamespace(step=0), echo=lines.append, logger=None)
    HeldoutEvaluator(SimpleNamespace(prompts=str(prompts), num_prompts=3, max_new_tokens=8),
                     target.tokenizer)(trainer)
    assert lines[0].startswith("step 0 | held-out evaluation") and "3 prompts" in lines[0]
    assert [line.split(":")[0] for line in lines[1:4]] == [f"  held-out prompt {i}/3" for i in (1, 2, 3)]
    assert lines[-1].startswith("step 0 | held-out tau")


def test_demo_summary_names_the_run_folder_numbers_and_next_commands(tmp_path):
    from dflash_train.config import load_config
    from dflash_train.train.cli import demo_plan, demo_summary

    run, ckpt = tmp_path / "demo-run", tmp_path / "demo-run" / "checkpoints" / "step-00000120"
    cfg = load_config("cpu-demo", [f"train.run_dir={run}"])
    result = {"first_loss": 9.5, "last_loss": 4.25, "first_expected_acceptance": 1.1,
              "last_expected_acceptance": 1.9, "tau_before": 1.0, "tau_after": 1.62, "checkpoint": str(ckpt)}
    text = demo_summary(cfg, result, 330.0)
    assert "demo: done in 5.5 min" in text and f"{run} (checkpoint {ckpt}" in text
    assert "9.500 -> 4.250" in text and "1.00 before -> 1.62 after" in text
    assert f"dflash-train export {run} {run}-drafter" in text
    assert f"dflash-train eval --target assets/smollm2 --drafter {run}-drafter" in text
    assert '"num_speculative_tokens": 7' in text  # block 8: what the exported config serves with
    assert "{" not in text.split("serve:")[0], "no raw JSON before the serving line"
    plan = demo_plan(cfg)
    assert "shorter than 16 tokens" in plan and "4 prompts" in plan
