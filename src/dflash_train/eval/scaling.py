"""Held-out tau against training compute, with a log-linear fit: what would tau X cost?

Each point is one training run (its own budget and schedule, not a mid-run checkpoint)
and the ``eval.json`` of its exported drafter. Over the range measured, tau grows
roughly linearly in log(compute), so the fit is ``tau = a + b * log10(GPU-minutes)``
(least squares) and the cost of a target tau is read off the line. That is an
extrapolation: it says what the trend predicts, not what a run would reach.

    python -m dflash_train.eval.scaling --point 1=r1/eval.json --point 2=r2/eval.json \\
        --point 4=r4/eval.json --point 15=main/eval.json --prompts 1-24 --goal 3 \\
        --out tau_vs_compute.png --json tau_vs_compute.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_train.eval.compare import load_report, parse_range, steps_tau


@dataclass
class Fit:
    """``tau = intercept + slope * log10(gpu_minutes)``."""

    intercept: float
    slope: float
    r2: float

    def tau_at(self, gpu_minutes: float) -> float:
        return self.intercept + self.slope * math.log10(gpu_minutes)

    def minutes_for(self, tau: float) -> float | None:
        """GPU-minutes the line needs for ``tau`` (None if tau does not grow)."""
        if self.slope <= 0:
            return None
        return 10 ** ((tau - self.intercept) / self.slope)


def fit_log_linear(minutes: list[float], taus: list[float]) -> Fit:
    if len(minutes) < 2 or len(set(minutes)) < 2:
        raise ValueError("a fit needs at least two different compute budgets")
    xs = [math.log10(m) for m in minutes]
    mx, my = sum(xs) / len(xs), sum(taus) / len(taus)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, taus)) / sxx
    intercept = my - slope * mx
    total = sum((y - my) ** 2 for y in taus)
    resid = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, taus))
    return Fit(intercept, slope, 1.0 - resid / total if total > 0 else 1.0)


def parse_point(text: str) -> tuple[float, str]:
    minutes, sep, path = text.partition("=")
    try:
        value = float(minutes)
    except ValueError:
        value = -1.0
    if not sep or value <= 0:
        raise ValueError(f"--point {text!r}: expected GPU_MINUTES=EVAL_JSON with GPU_MINUTES > 0")
    return value, path


def plot(minutes, taus, fit: Fit, goals: list[float], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    needs = [n for n in (fit.minutes_for(g) for g in goals) if n and n < 1e6]
    hi = max([max(minutes), *needs]) * 1.5
    grid = [min(minutes) / 1.5 * (hi / (min(minutes) / 1.5)) ** (i / 99) for i in range(100)]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(minutes, taus, "o", color="C0", label="held-out tau (one run each)")
    ax.plot(grid, [fit.tau_at(g) for g in grid], "--", color="C1",
            label=f"fit: tau = {fit.intercept:.2f} + {fit.slope:.2f} log10(GPU-min), R^2 {fit.r2:.2f}")
    for goal in goals:
        need = fit.minutes_for(goal)
        if need:
            ax.axhline(goal, color="grey", lw=0.8)
            ax.annotate(f"tau {goal:g}: ~{need:,.0f} GPU-min (extrapolated)", (need, goal), textcoords="offset points",
                        xytext=(-10, -12), ha="right", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("training compute (H200 GPU-minutes, log scale)")
    ax.set_ylabel("held-out tau (B = 16, greedy)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", action="append", required=True, help="GPU_MINUTES=EVAL_JSON (repeatable)")
    parser.add_argument("--prompts", default=None, help="1-based prompt range, e.g. 1-24 (default: all)")
    parser.add_argument("--goal", type=float, action="append", default=None,
                        help="a tau whose cost the fit reports (repeatable; default 3)")
    parser.add_argument("--title", default="DFlash drafter: held-out tau vs training compute")
    parser.add_argument("--out", default="tau_vs_compute.png")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        points = sorted(parse_point(p) for p in args.point)
        taus = []
        for _, path in points:
            prompts = load_report(path)["prompts"]
            if args.prompts:
                first, last = parse_range(args.prompts)
                prompts = prompts[first:last]
            taus.append(steps_tau(prompts))
        minutes = [m for m, _ in points]
        fit = fit_log_linear(minutes, taus)
    except ValueError as err:
        print(f"scaling: {err}", file=sys.stderr)
        return 2
    goals = args.goal or [3.0]
    plot(minutes, taus, fit, goals, Path(args.out), args.title)
    result = {"points": [{"gpu_minutes": m, "tau": t, "eval": p} for (m, p), t in zip(points, taus)],
              "fit": asdict(fit), "goal_tau": goals[0], "gpu_minutes_for_goal": fit.minutes_for(goals[0]),
              "goals": [{"tau": g, "gpu_minutes": fit.minutes_for(g)} for g in goals]}
    for (m, _), t in zip(points, taus):
        print(f"{m:8.2f} GPU-min  tau {t:.3f}  (fit {fit.tau_at(m):.3f})")
    costs = "; ".join(f"tau {g['tau']:g} at " + ("never (no growth)" if g["gpu_minutes"] is None
                                                  else f"~{g['gpu_minutes']:,.0f} GPU-min") for g in result["goals"])
    print(f"fit: tau = {fit.intercept:.3f} + {fit.slope:.3f} * log10(GPU-min), R^2 {fit.r2:.3f}; {costs}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
