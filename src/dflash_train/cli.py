"""``dflash-train`` command line: one sub-command per module, registered here.

Each feature module exposes ``register(subparsers)`` that adds its sub-command and
sets ``func`` on the parsed namespace; this file only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-train", description=__doc__.splitlines()[0])
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
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"dflash-train {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dflash-train {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
