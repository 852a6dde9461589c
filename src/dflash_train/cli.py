"""``dflash-train``: every tool a user runs, as one command with sub-commands.

Developers: each feature module exposes ``register(subparsers)``, which adds its
sub-command(s) and sets ``func`` on the parsed namespace; ``COMMANDS`` lists the modules and
``GROUPS`` places each sub-command in the user-facing overview of ``dflash-train --help``
(a test fails when a registered command is in no group).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dflash_train.files import describe_os_error

# the modules whose ``register`` adds sub-command(s), in the order they are registered
COMMANDS = [
    "dflash_train.train.cli",
    "dflash_train.data.cli",
    "dflash_train.data.builders.prompts",
    "dflash_train.data.builders.offline_data",
    "dflash_train.export.cli",
    "dflash_train.eval.cli",
    "dflash_train.eval.replay",
    "dflash_train.eval.compare",
    "dflash_train.eval.scaling",
    "dflash_train.train.curve",
    "dflash_train.bench.cli",
    "dflash_train.bench.decode_steps",
    "dflash_train.bench.generate",
    "dflash_train.bench.fp8_features",
    "dflash_train.distributed.cli",
    "dflash_train.distributed.feature_job",
    "dflash_train.config_cli",
    "dflash_train.assets",
    "dflash_train.llamacpp.build",
    "dflash_train.vllm.install",
]

DESCRIPTION = """\
Train DFlash drafters: small block-diffusion models that propose a block of tokens at
once for a Hugging Face causal LM (the target), which verifies them in one forward pass
(lossless speculative decoding). The trained drafter exports to the folder vLLM, SGLang
and the DFlash authors' code load.

Try it on a CPU in a few minutes:  dflash-train demo
Your own model:                    dflash-train train RECIPE_OR_CONFIG target.path=MODEL_FOLDER"""

# (heading, sub-commands, a closing line or None): the workflow first, then the side tools
GROUPS = [
    ("1. data", ["offline-data", "prompts", "regenerate", "data"], None),
    ("2. train", ["config", "features", "train", "demo", "tiny-model", "plan"], None),
    ("3. export", ["export"], None),
    ("4. evaluate", ["eval", "replay"], None),
    ("5. serve", ["llama-cpp", "vllm"], "the exported folder's README.md gives the vLLM and SGLang command lines, "
                                "with its block size filled in"),
    ("benchmarks", ["bench", "bench-decode", "bench-generate", "bench-fp8-features"], None),
    ("analysis", ["curve", "compare", "scaling"], None),
]


class OneLineParser(argparse.ArgumentParser):
    """A bad flag (e.g. ``--limit 0``, see ``cli_types``) answers in one line naming it, not
    the usage block; sub-commands' parsers are of the same class (argparse's default)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_overview(helps: dict[str, str]) -> str:
    """The grouped list of sub-commands for ``--help``; commands in no group come last."""
    width = max(len(name) for name in helps) + 2
    lines = ["commands (dflash-train COMMAND --help shows a command's flags):"]
    placed = set()
    for heading, names, note in GROUPS:
        lines.append(f"  {heading}")
        for name in names:
            if name in helps:
                placed.add(name)
                lines.append(f"    {name:<{width}}{helps[name]}")
        if note:
            lines.append(f"    {note}")
    rest = [name for name in helps if name not in placed]
    if rest:
        lines.append("  other")
        lines += [f"    {name:<{width}}{helps[name]}" for name in rest]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dflash-train", usage="dflash-train COMMAND [ARGS] (dflash-train COMMAND --help)",
                           description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS,
                                prog="dflash-train")
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ImportError as err:  # a missing optional dependency disables only that command
            print(f"dflash-train: {name} unavailable ({err})", file=sys.stderr)
            continue
        module.register(sub)
    parser.epilog = command_overview({action.dest: action.help for action in sub._choices_actions})
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as err:  # bad input, and every files.UserFacingError (a ValueError)
        print(f"dflash-train {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file fault no caller explained: still one line, naming the path
        text = str(err) if err.errno is None else describe_os_error(err, "file" if err.filename else "operation")
        print(f"dflash-train {args.command}: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dflash-train {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
