"""The training curve of a run as a PNG: expected acceptance (from training accuracy) next to
the real held-out tau over steps.

Training accuracy flatters a drafter (teacher-forced, on the training distribution); the
held-out tau comes from real speculative decoding on prompts never trained on. Plotting
both on one axis shows the gap, which is the number that matters::

    dflash-train curve runs/smollm2 --out curve.png [--label main] [RUN2 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dflash_train.cli_types import register_tool, tool_parser
from dflash_train.files import explained, write_figure
from dflash_train.run_folder import METRICS
from dflash_train.tracking.jsonl import check_line, report_lines

PLOT_TODO = "free space or choose another --out"


def read_curve(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) series from ``metrics.jsonl``: expected acceptance, held-out tau, loss.

    A last line without its newline was torn by a kill (a run stopped mid-append) and is
    skipped, as the resume drops it; any other bad line is one line naming ``file:line``; an
    unreadable file (permissions, a dangling link, a folder, I/O error) is one line naming it."""
    path = Path(run_dir) / METRICS
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"{path}: no {METRICS} (is {run_dir} a training run folder?)")
    with explained("cannot read metrics", path):
        data = path.read_bytes()
    series: dict[str, list[tuple[int, float]]] = {"expected_acceptance": [], "tau": [], "loss": []}
    for number, record in _records(path, data):
        for key in series:
            if key in record and "step" in record:
                series[key].append(_point(path, number, record, key))
    return series


def _records(path: Path, data: bytes):
    """``(line number, object)`` for each complete non-empty line; a bad one is one line, one
    whose checksum does not match (its bytes changed, still JSON) is dropped with a counted note."""
    lines = data.split(b"\n")
    bad, old = [], []
    for number, raw in enumerate(lines[:-1], 1):  # lines[-1]: b"" or the torn last line
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path}:{number}: not UTF-8 text") from None
        if not line.strip():
            continue
        try:
            json.loads(line)
        except (ValueError, RecursionError) as err:
            raise ValueError(f"{path}:{number}: not JSON ({getattr(err, 'msg', 'nested too deeply')})") from None
        record = check_line(line, path, number, bad, old)  # a checksum mismatch: dropped, counted
        if record is None:
            continue
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: not a JSON object")
        yield number, record
    report_lines(path, bad, old)


def _point(path: Path, number: int, record: dict, key: str) -> tuple[int, float]:
    try:
        return int(record["step"]), float(record[key])
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{path}:{number}: step {record['step']!r:.40} or {key} {record[key]!r:.40} is not a number") from None


def plot_curves(runs: dict[str, dict], out: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for index, (label, series) in enumerate(runs.items()):
        color = f"C{index % 10}"  # matplotlib's color cycle: every run is drawn, whatever their number
        if series["expected_acceptance"]:
            steps, values = zip(*series["expected_acceptance"])
            ax1.plot(steps, values, color=color, alpha=0.6, label=f"{label}: expected acceptance (train accuracy)")
        if series["tau"]:
            steps, values = zip(*series["tau"])
            ax1.plot(steps, values, color=color, marker="o", lw=2, label=f"{label}: held-out tau (spec. decoding)")
        if series["loss"]:
            steps, values = zip(*series["loss"])
            ax2.plot(steps, values, color=color, label=label)
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("tokens per verify step")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("training loss (decayed CE)")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    with explained("cannot write the curve's folder", out.parent, PLOT_TODO):
        out.parent.mkdir(parents=True, exist_ok=True)
    return write_figure(fig, out, "curve plot", PLOT_TODO)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's flags, on ``parser`` (the ``dflash-train curve`` sub-command's or a new one)."""
    parser.add_argument("runs", nargs="+", help=f"run folders (each with {METRICS})")
    parser.add_argument("--label", action="append", default=None, help="one per run (default: folder names)")
    parser.add_argument("--out", required=True, help="the PNG file to write")


def register(sub) -> None:
    """``dflash-train curve``."""
    register_tool(sub, "curve", "a run's training curve as a PNG: expected acceptance next to held-out tau", __doc__, add_arguments, run)


def main(argv: list[str] | None = None) -> int:
    return run(tool_parser(__doc__, add_arguments).parse_args(argv))


def run(args: argparse.Namespace) -> int:
    labels = args.label or [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        raise ValueError(f"give one --label per run ({len(args.runs)} runs, {len(labels)} labels)")
    try:
        runs = {label: read_curve(run) for label, run in zip(labels, args.runs)}
    except (FileNotFoundError, ValueError) as err:
        print(f"curve: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {plot_curves(runs, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
