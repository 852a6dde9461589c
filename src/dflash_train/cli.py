"""``dflash-train`` command line: one sub-command per module, registered here.

Each feature module exposes ``register(subparsers)`` that adds its sub-command and
sets ``func`` on the parsed namespace; this file only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dflash_train.files import describe_os_error

# (module, attribute) pairs; each module's ``register`` adds its sub-command(s).
COMMANDS = [
    "dflash_train.train.cli",
    "dflash_train.data.cli",
    "dflash_train.export.cli",
    "dflash_train.eval.cli",
    "dflash_train.bench.cli",
    "dflash_train.distributed.cli",
    "dflash_train.config_cli",
]


class OneLineParser(argparse.ArgumentParser):
    """A bad flag (e.g. ``--limit 0``, see ``cli_types``) answers in one line naming it, not
    the usage block; sub-commands' parsers are of the same class (argparse's default)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dflash-train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ImportError as err:  # a missing optional dependency disables only that command
            print(f"dflash-train: {name} unavailable ({err})", file=sys.stderr)
            continue
        module.register(sub)
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
