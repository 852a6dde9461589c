"""Held-out tau against training compute, with a log-linear fit: what would tau X cost?

Each point is one training run (its own budget and schedule, not a mid-run checkpoint)
and the ``eval.json`` of its exported drafter. Over the range measured, tau grows
roughly linearly in log(compute), so the fit is ``tau = a + b * log10(GPU-minutes)``
(least squares) and the cost of a target tau is read off the line. That is an
extrapolation: it says what the trend predicts, not what a run would reach.

    dflash-train scaling --point 1=r1/eval.json --point 2=r2/eval.json \\
        --point 4=r4/eval.json --point 15=main/eval.json --prompts 1-24 --goal 3 \\
        --out tau_vs_compute.png --json tau_vs_compute.json

Two recipes on one plot: name each point's series, ``--point "new recipe@6=main/eval.json"``.
Each series gets its own line (when it has two budgets or more); the first is the one whose
fit the JSON's top-level fields report. Comparing lines, not single points, says whether a
change moves the whole curve or only its start.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_train.cli_types import float_at_least, register_tool, tool_parser
from dflash_train.eval.compare import load_report, parse_range, steps_tau
from dflash_train.files import atomic_write_text, write_figure

WRITE_TODO = "free space or choose another --out"


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


def parse_point(text: str) -> tuple[str, float, str]:
    """``[SERIES@]GPU_MINUTES=EVAL_JSON`` -> (series, minutes, path); no series: ``""``."""
    head, sep, path = text.partition("=")
    series, _, minutes = head.rpartition("@")
    try:
        value = float(minutes)
    except ValueError:
        value = -1.0
    if not sep or value <= 0:
        raise ValueError(f"--point {text!r}: expected [SERIES@]GPU_MINUTES=EVAL_JSON with GPU_MINUTES > 0")
    return series, value, path


@dataclass
class Series:
    """One recipe's runs: (GPU-minutes, held-out tau) and their line, if there are two budgets."""

    label: str
    minutes: list[float]
    taus: list[float]
    evals: list[str]
    fit: Fit | None


def read_series(point_args: list[str], prompts: str | None) -> list[Series]:
    """Group ``--point`` values by series (in order of first appearance) and read their taus."""
    groups: dict[str, list[tuple[float, str]]] = {}
    for series, minutes, path in (parse_point(p) for p in point_args):
        groups.setdefault(series, []).append((minutes, path))
    out = []
    for label, points in groups.items():
        points.sort()
        taus = []
        for _, path in points:
            runs = load_report(path)["prompts"]
            if prompts:
                first, last = parse_range(prompts)
                runs = runs[first:last]
            taus.append(steps_tau(runs))
        minutes = [m for m, _ in points]
        fit = fit_log_linear(minutes, taus) if len(set(minutes)) > 1 else None
        out.append(Series(label, minutes, taus, [p for _, p in points], fit))
    if out[0].fit is None:
        raise ValueError(f"series {out[0].label or '(unnamed)'}: a fit needs at least two different compute budgets")
    return out


def plot(series: list[Series], goals: list[float], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fits = [x.fit for x in series if x.fit is not None]
    needs = [n for f in fits for n in (f.minutes_for(g) for g in goals) if n and n < 1e6]
    lo = min(min(x.minutes) for x in series) / 1.5
    hi = max([*(max(x.minutes) for x in series), *needs]) * 1.5
    grid = [lo * (hi / lo) ** (i / 99) for i in range(100)]
    entries = len(series) + len(fits)
    fig, ax = plt.subplots(figsize=(6.4, 4.2 + 0.16 * entries))  # the legend sits below the axes
    colors = plt.get_cmap("tab20").colors  # a point colour and its fit's lighter pair, 10 series apart
    for i, x in enumerate(series):
        name = x.label or "held-out tau"
        ax.plot(x.minutes, x.taus, "os^v"[i % 4], color=colors[2 * i % 20], label=f"{name} (one run each)")
        if x.fit is not None:
            # each goal's cost goes into the fit's legend entry and a tick where the line crosses it:
            # with several lines, text next to the crossings piles up where the lines meet
            f = x.fit
            crossings = [(f.minutes_for(goal), goal) for goal in goals if f.minutes_for(goal)]
            costs = "".join(f"; tau {goal:g} at ~{need:,.0f}" for need, goal in crossings)
            ax.plot(grid, [f.tau_at(g) for g in grid], "--", color=colors[(2 * i + 1) % 20],
                    label=f"fit: tau = {f.intercept:.2f} + {f.slope:.2f} log10(GPU-min), R^2 {f.r2:.2f}{costs}")
            if crossings:
                ax.plot(*zip(*crossings), "|", color=colors[2 * i % 20], markersize=9, markeredgewidth=1.5)
    for goal in goals:
        ax.axhline(goal, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training compute (H200 GPU-minutes, log scale)")
    ax.set_ylabel("held-out tau (B = 16, greedy)")
    ax.set_title(title + " (lines extrapolated)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.tight_layout()
    _save(fig, out)


def _save(fig, out: Path) -> None:
    write_figure(fig, out, "scaling plot", WRITE_TODO, dpi=120)


def _cost(tau: float, fit: Fit) -> str:
    need = fit.minutes_for(tau)
    return f"tau {tau:g} at " + ("never (no growth)" if need is None else f"~{need:,.0f} GPU-min")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's flags, on ``parser`` (the ``dflash-train scaling`` sub-command's or a new one)."""
    parser.add_argument("--point", action="append", required=True, help="[SERIES@]GPU_MINUTES=EVAL_JSON (repeatable)")
    parser.add_argument("--prompts", default=None, help="1-based prompt range, e.g. 1-24 (default: all)")
    parser.add_argument("--goal", type=float_at_least(1.0), action="append", default=None,
                        help="a tau (>= 1: tau counts the bonus token) whose cost the fit reports (repeatable; default 3)")
    parser.add_argument("--title", default="DFlash drafter: held-out tau vs training compute", help="the plot's title")
    parser.add_argument("--out", default="tau_vs_compute.png", help="the PNG file to write")
    parser.add_argument("--json", default=None, help="also write the points, fits and goal costs as JSON here")


def register(sub) -> None:
    """``dflash-train scaling``."""
    register_tool(sub, "scaling", "held-out tau against training compute, with a log-linear fit (PNG + JSON)", __doc__, add_arguments, run)


def main(argv: list[str] | None = None) -> int:
    return run(tool_parser(__doc__, add_arguments).parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        series = read_series(args.point, args.prompts)
    except ValueError as err:
        print(f"scaling: {err}", file=sys.stderr)
        return 2
    goals = args.goal or [3.0]
    plot(series, goals, Path(args.out), args.title)
    rows = []
    for x in series:
        rows.append({"label": x.label, "fit": asdict(x.fit) if x.fit else None,
                     "points": [{"gpu_minutes": m, "tau": t, "eval": p} for m, t, p in zip(x.minutes, x.taus, x.evals)],
                     "goals": [{"tau": g, "gpu_minutes": x.fit.minutes_for(g) if x.fit else None} for g in goals]})
        for m, t in zip(x.minutes, x.taus):
            fitted = f"  (fit {x.fit.tau_at(m):.3f})" if x.fit else ""
            print(f"{x.label + ': ' if x.label else ''}{m:8.2f} GPU-min  tau {t:.3f}{fitted}")
        if x.fit:
            f = x.fit
            print(f"{x.label + ': ' if x.label else ''}fit: tau = {f.intercept:.3f} + {f.slope:.3f} * log10(GPU-min), "
                  f"R^2 {f.r2:.3f}; " + "; ".join(_cost(g, f) for g in goals))
    first = rows[0]
    result = {"points": first["points"], "fit": first["fit"], "goal_tau": goals[0],
              "gpu_minutes_for_goal": first["goals"][0]["gpu_minutes"], "goals": first["goals"], "series": rows}
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1), "scaling table", "free space or choose another --json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
