"""Paired comparison of evaluations on the same prompts: is a change real or noise?

Two drafters evaluated on the same prompts differ mostly because prompts differ: some
answers are easy to draft (lists, code, loops), some hard. Comparing per prompt removes
that shared part. For each variant against a base this reports, over a chosen range of
prompts, the mean tau of each (over all verify steps, as ``eval`` does), the mean
per-prompt difference with its standard error, and on how many prompts the variant wins.

    python -m dflash_train.eval.compare base/eval.json lr2e-3/eval.json gamma4/eval.json \\
        --prompts 1-24 --prompts 25-40 --json table.json

Prompt ranges are 1-based and inclusive, as one reads a prompt file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Paired:
    """One variant against the base on one prompt range."""

    variant: str
    prompts: str
    base_tau: float
    variant_tau: float
    mean_diff: float  # mean over prompts of (variant tau - base tau)
    stderr: float  # standard error of that mean
    wins: int
    n: int


def parse_range(text: str) -> tuple[int, int]:
    """``"25-40"`` -> (24, 40): a 0-based half-open slice of the prompt list."""
    try:
        first, last = (int(x) for x in text.split("-"))
    except ValueError:
        raise ValueError(f"--prompts {text!r}: expected FIRST-LAST, e.g. 1-24") from None
    if not 1 <= first <= last:
        raise ValueError(f"--prompts {text!r}: need 1 <= FIRST <= LAST")
    return first - 1, last


def load_report(path: str | Path) -> dict:
    """An ``eval.json`` (or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "eval.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read an eval report ({err})") from None
    if "prompts" not in report:
        raise ValueError(f"{path}: no per-prompt results (field 'prompts'); was it written by dflash-train eval?")
    return report


def steps_tau(prompts: list[dict]) -> float:
    """Mean acceptance length over all verify steps of these prompts (eval's ``mean_tau``)."""
    lengths = [t for p in prompts for t in p["acceptance_lengths"]]
    return sum(lengths) / len(lengths) if lengths else float("nan")


def compare(base: dict, variant: dict, name: str, span: tuple[int, int]) -> Paired:
    first, last = span
    b, v = base["prompts"][first:last], variant["prompts"][first:last]
    if len(b) != last - first or len(v) != len(b):
        raise ValueError(f"{name}: prompts {first + 1}-{last} not all present (base {len(base['prompts'])}, "
                         f"variant {len(variant['prompts'])})")
    diffs = [y["tau"] - x["tau"] for x, y in zip(b, v)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    return Paired(name, f"{first + 1}-{last}", steps_tau(b), steps_tau(v), mean, math.sqrt(var / n),
                  sum(d > 0 for d in diffs), n)


def format_rows(rows: list[Paired]) -> str:
    lines = ["| variant | prompts | base tau | variant tau | paired diff (mean +- s.e.) | wins |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.variant} | {r.prompts} | {r.base_tau:.3f} | {r.variant_tau:.3f} | "
                     f"{r.mean_diff:+.3f} +- {r.stderr:.3f} | {r.wins}/{r.n} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the base eval.json (or its folder)")
    parser.add_argument("variants", nargs="+", help="eval.json files (or folders) of the variants")
    parser.add_argument("--prompts", action="append", default=None, help="1-based range, e.g. 1-24 (repeatable)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    try:
        base = load_report(args.base)
        spans = [parse_range(s) for s in (args.prompts or [f"1-{len(base['prompts'])}"])]
        rows = [compare(base, load_report(path), Path(path).name if Path(path).is_dir() else str(path), span)
                for span in spans for path in args.variants]
    except ValueError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
