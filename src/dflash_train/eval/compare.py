"""Paired comparison of evaluations on the same prompts: is a change real or noise?

Two drafters evaluated on the same prompts differ mostly because prompts differ: some
answers are easy to draft (lists, code, loops), some hard. Comparing per prompt removes
that shared part. For each variant against a base this reports, over a chosen range of
prompts, the mean tau of each (kept tokens over all verify steps, as ``eval`` does; older reports
are recounted the same way, ``eval/accounting.py``), the mean
per-prompt difference with its standard error, and on how many prompts the variant wins.

    dflash-train compare base/eval.json lr2e-3/eval.json gamma4/eval.json \\
        --prompts 1-24 --prompts 25-40 --json table.json

Prompt ranges are 1-based and inclusive, as one reads a prompt file.

Choosing between ablations inside a script (where nobody reads the table before the next
step starts): ``--choose 1-96 --min-se 1`` names the variant with the largest paired gain
on that range if the gain is above ``--min-se`` standard errors, else the base (a line
``choice: NAME ...``; the JSON then holds ``rows``, ``choice`` and ``skipped``);
``--skip-missing`` drops variants whose report does not exist (a run that found no time),
counted in the output, instead of failing the whole comparison. Choose on prompts you do
not report on (the ``selection`` set).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_train.cli_types import nonnegative_float, register_tool, tool_parser
from dflash_train.eval.accounting import pooled_tau, prompt_tau
from dflash_train.files import UserFacingError, atomic_write_text, read_text


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
        report = json.loads(read_text(path, "eval report"))
    except (ValueError, RecursionError) as err:
        if isinstance(err, UserFacingError):
            raise
        raise ValueError(f"{path}: not an eval report ({getattr(err, 'msg', 'nested too deeply')})") from None
    prompts = report.get("prompts") if isinstance(report, dict) else None
    if not isinstance(prompts, list):
        raise ValueError(f"{path}: no per-prompt results (field 'prompts'); was it written by dflash-train eval?")
    if not all(_is_prompt_result(p) for p in prompts):
        raise ValueError(f"{path}: a per-prompt result without a numeric 'tau' and a list 'acceptance_lengths'")
    return report


def _is_prompt_result(entry) -> bool:
    """The fields ``compare`` reads of one prompt's result, with their types."""
    return (isinstance(entry, dict) and isinstance(entry.get("tau"), int | float)
            and isinstance(entry.get("acceptance_lengths"), list)
            and all(isinstance(t, int | float) for t in entry["acceptance_lengths"]))


def steps_tau(prompts: list[dict]) -> float:
    """Tau pooled over all verify steps of these prompts (eval's ``mean_tau``; kept tokens)."""
    return pooled_tau(prompts)


def compare(base: dict, variant: dict, name: str, span: tuple[int, int]) -> Paired:
    first, last = span
    b, v = base["prompts"][first:last], variant["prompts"][first:last]
    if len(b) != last - first or len(v) != len(b):
        raise ValueError(f"{name}: prompts {first + 1}-{last} not all present (base {len(base['prompts'])}, "
                         f"variant {len(variant['prompts'])})")
    diffs = [prompt_tau(y) - prompt_tau(x) for x, y in zip(b, v)]
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


def choose(rows: list[Paired], prompts: str, min_se: float) -> Paired | None:
    """The row on ``prompts`` with the largest mean gain, if above ``min_se`` standard errors."""
    candidates = [r for r in rows if r.prompts == prompts and r.mean_diff > min_se * r.stderr and r.mean_diff > 0]
    return max(candidates, key=lambda r: r.mean_diff) if candidates else None


def _report_exists(path: str) -> bool:
    p = Path(path)
    return (p / "eval.json").is_file() if p.is_dir() else p.is_file()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's flags, on ``parser`` (the ``dflash-train compare`` sub-command's or a new one)."""
    parser.add_argument("base", help="the base eval.json (or its folder)")
    parser.add_argument("variants", nargs="+", help="eval.json files (or folders) of the variants")
    parser.add_argument("--prompts", action="append", default=None, help="1-based range, e.g. 1-24 (repeatable)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--skip-missing", action="store_true",
                        help="drop variants whose report does not exist (counted) instead of failing")
    parser.add_argument("--choose", default=None, metavar="RANGE",
                        help="name the variant with the largest gain on this prompt range (one of --prompts)")
    parser.add_argument("--min-se", type=nonnegative_float, default=2.0,
                        help="--choose takes a variant only if its gain is above this many standard errors")


def register(sub) -> None:
    """``dflash-train compare``."""
    register_tool(sub, "compare", "paired tau differences of eval.json reports against a base, per prompt range", __doc__, add_arguments, run)


def main(argv: list[str] | None = None) -> int:
    return run(tool_parser(__doc__, add_arguments).parse_args(argv))


def run(args: argparse.Namespace) -> int:
    variants = args.variants
    missing = [v for v in variants if not _report_exists(v)] if args.skip_missing else []
    variants = [v for v in variants if v not in missing]
    try:
        base = load_report(args.base)
        ranges = args.prompts or [f"1-{len(base['prompts'])}"]
        if args.choose is not None and args.choose not in ranges:
            raise ValueError(f"--choose {args.choose}: not one of the --prompts ranges {ranges}")
        spans = [parse_range(s) for s in ranges]
        rows = [compare(base, load_report(path), Path(path).name if Path(path).is_dir() else str(path), span)
                for span in spans for path in variants]
    except ValueError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    if missing:
        print(f"skipped {len(missing)} variant(s) without a report: {', '.join(missing)}")
    result: dict | list = [asdict(r) for r in rows]
    if args.choose is not None:
        pick = choose(rows, args.choose, args.min_se)
        line = (f"choice: {pick.variant} ({pick.mean_diff:+.3f} +- {pick.stderr:.3f} on prompts {args.choose})" if pick
                else f"choice: base (no variant above {args.min_se:g} standard errors on prompts {args.choose})")
        print(line)
        result = {"rows": result, "choice": pick.variant if pick else "base", "choice_line": line, "skipped": missing}
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1), "comparison", "free space or choose another --json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
