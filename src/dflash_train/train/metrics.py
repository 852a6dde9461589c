"""Training metrics: device-side accumulation, then console, TensorBoard and JSON lines.

The hot loop only adds tensors on the device; the one host sync happens when a
logging window closes.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from dflash_train.files import atomic_write_text, explained
from dflash_train.objective.blocks import expected_acceptance_from_accuracy
from dflash_train.objective.loss import AcceptanceStats
from dflash_train.run_folder import METRICS, TENSORBOARD


class MetricWindow:
    """Sums of loss pieces and acceptance counters since the last log line."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.loss_sum = None
        self.good = None  # device count of steps with a finite loss (when the trainer says which)
        self.steps = 0
        self.stats: AcceptanceStats | None = None
        self.tokens = 0
        self.started = time.perf_counter()

    def add_step(self, loss: torch.Tensor, stats: list[AcceptanceStats], context_tokens: int,
                 good: torch.Tensor | None = None) -> None:
        """``good`` (a device bool): False for a skipped non-finite step, left out of the mean loss."""
        loss = loss.detach()
        if good is not None:
            loss = torch.where(good, loss, torch.zeros_like(loss))
            self.good = good.float() if self.good is None else self.good + good.float()
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.steps += 1
        self.tokens += context_tokens
        for s in stats:
            if self.stats is None:
                self.stats = AcceptanceStats(*(t.clone() for t in vars(s).values()))
            else:
                for name, value in vars(s).items():
                    setattr(self.stats, name, getattr(self.stats, name) + value)

    def summary(self) -> dict[str, float]:
        """Host values (one sync): loss, per-position accuracy, expected acceptance, tokens/s."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        steps = self.steps if self.good is None else float(self.good)
        loss = float(self.loss_sum) / steps if steps else math.nan
        out = {"loss": loss, "tokens_per_s": self.tokens / elapsed}
        if self.stats is not None:
            valid = self.stats.valid_per_position.clamp(min=1)
            accuracy = (self.stats.correct_per_position / valid).tolist()
            accuracy = [a if v > 0 else math.nan for a, v in zip(accuracy, self.stats.valid_per_position.tolist())]
            out["accuracy"] = accuracy
            out["acc_pos1"] = accuracy[0]
            out["expected_acceptance"] = float(self.stats.accepted_sum / self.stats.blocks.clamp(min=1))
            out["expected_acceptance_from_accuracy"] = expected_acceptance_from_accuracy(accuracy)
        return out


WRITE_TODO = "free space or set train.run_dir elsewhere"


def _tensorboard(folder: Path, **kwargs):
    from torch.utils.tensorboard import SummaryWriter

    with explained("cannot write TensorBoard logs", folder, WRITE_TODO):
        return SummaryWriter(str(folder), **kwargs)


def _read_rows(path: Path) -> list[tuple[str, dict]]:
    """``(line, row)`` for every line of ``path`` that is a JSON object; torn, garbled or
    non-UTF-8 lines (a kill mid-append, a bad disk) are skipped. Unreadable: one line."""
    with explained("cannot read metrics", path):
        data = path.read_bytes()
    rows = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append((line, row))
    return rows


class MetricLogger:
    """Writes every record to ``metrics.jsonl`` and TensorBoard, and a short console line.

    A write that fails (no space, an I/O error) is one line naming the file: the run stops
    there, its last checkpoint intact; a line half-written by it is dropped at the resume
    (``rewind``)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True):
        self.enabled = enabled
        self.path = run_dir / METRICS
        self.tensorboard_dir = run_dir / TENSORBOARD
        self.writer = None
        if enabled and tensorboard:
            self.writer = _tensorboard(self.tensorboard_dir)

    def rewind(self, step: int) -> list[dict]:
        """Start logging after ``step`` (a resume; -1 for a fresh run) so the run reads as one:
        ``metrics.jsonl`` keeps only its rows up to ``step`` (rewritten atomically: the steps
        redone after the checkpoint are logged again, not twice), and TensorBoard hides events
        after it (``purge_step``). Returns the rows kept (``summary.json``'s first loss is the
        run's first). A line that is not JSON (torn by a kill) is dropped."""
        if not self.enabled:
            return []
        kept, lines = [], []
        if self.path.exists() or self.path.is_symlink():
            for line, row in _read_rows(self.path):
                if isinstance(row.get("step"), int) and row["step"] <= step:
                    kept.append(row)
                    lines.append(line)
            atomic_write_text(self.path, "".join(line + "\n" for line in lines), "metrics", WRITE_TODO)
        if self.writer is not None:
            self.writer.close()
            self.writer = _tensorboard(self.tensorboard_dir, purge_step=step + 1)
        return kept

    def log(self, step: int, record: dict, echo=print) -> None:
        if not self.enabled:
            return
        record = {"step": step, **record}
        with explained("cannot write metrics", self.path, WRITE_TODO), self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, int | float) and key != "step" and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
            for k, acc in enumerate(record.get("accuracy", []), start=1):
                if math.isfinite(acc):
                    self.writer.add_scalar(f"accuracy/pos{k}", acc, step)
            self.writer.flush()
        echo(format_record(record))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def format_record(record: dict) -> str:
    parts = [f"step {record['step']}"]
    for key, fmt in (("loss", ".4f"), ("acc_pos1", ".3f"), ("expected_acceptance", ".3f"), ("tau", ".3f"),
                     ("lr", ".2e"), ("tokens_per_s", ".0f")):
        if key in record and isinstance(record[key], int | float):
            parts.append(f"{key} {record[key]:{fmt}}")
    return " | ".join(parts)
