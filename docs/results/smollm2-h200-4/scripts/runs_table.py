"""The ablation and curve table of call 3: held-out tau (exact greedy replay, fp32, 128 new
tokens) of every run, and each ablation's paired per-prompt difference against ``base``.

All runs trained with fixed step counts (``train.max_steps``), four at a time on one H200, so
their tokens/s are shared; their GPU-minutes are steps at the main run's own rate (alone on the
GPU). Prompts 1-24 are the reported set; 25-40 are the rest of the held-out file.

    python docs/results/smollm2-h200-4/scripts/runs_table.py docs/results/smollm2-h200-4/runs [STEPS_PER_MIN]
"""
import json
import statistics
import sys
from pathlib import Path

from dflash_train.eval.compare import compare, load_report, parse_range

root = Path(sys.argv[1])
rate = float(sys.argv[2]) if len(sys.argv) > 2 else None
lines = [line.split("|") for line in (root / "list.txt").read_text().splitlines() if line.strip()]
reports = {name: load_report(root / name / "eval.json") for name, *_ in lines if (root / name / "eval.json").exists()}


def tau(report: dict, span: str) -> float:
    """Tau over the prompts of ``span`` as eval computes it: tokens per verify step."""
    first, last = parse_range(span)
    chosen = report["prompts"][first:last]
    steps = sum(len(p["acceptance_lengths"]) for p in chosen)
    return sum(sum(p["acceptance_lengths"]) for p in chosen) / steps if steps else float("nan")


def paired(name: str, span: str) -> str:
    if name == "base" or "base" not in reports:
        return ""
    try:
        p = compare(reports["base"], reports[name], name, parse_range(span))
    except ValueError as err:
        return str(err)
    return f"{p.mean_diff:+.3f} +- {p.stderr:.3f} ({p.wins}/{p.n})"


print("| run | overrides | steps | GPU-min | tau 1-24 | tau 25-40 | tau 1-40 | vs base, 1-40: mean +- s.e. (wins) |"
      " tokens/s (shared) |")
print("|---|---|---|---|---|---|---|---|---|")
for name, steps, overrides in lines:
    if name not in reports:
        print(f"| {name} | `{overrides}` | {steps} | | no replay | | | | |")
        continue
    metrics = [json.loads(x) for x in (root / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rates = [m["tokens_per_s"] for m in metrics[1:] if "tokens_per_s" in m]
    r = reports[name]
    minutes = f"{int(steps) / rate:.2f}" if rate else ""
    print(f"| {name} | `{overrides or '(recipe)'}` | {steps} | {minutes} | {tau(r, '1-24'):.3f} | "
          f"{tau(r, '25-40'):.3f} | {tau(r, '1-40'):.3f} | {paired(name, '1-40')} | "
          f"{statistics.median(rates) if rates else 0:,.0f} |")
