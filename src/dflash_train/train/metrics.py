"""Training metrics: device-side accumulation over a logging window, and its console line.

The hot loop only adds tensors on the device; the one host sync happens when a logging
window closes. The record it gives goes to the run's sinks (``tracking/``).
"""

from __future__ import annotations

import math
import time

import torch

from dflash_train.objective.blocks import expected_acceptance_from_accuracy
from dflash_train.objective.loss import AcceptanceStats


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


def format_record(record: dict) -> str:
    """The console line of a record (``step`` included)."""
    parts = [f"step {record['step']}"]
    for key, fmt in (("loss", ".4f"), ("acc_pos1", ".3f"), ("expected_acceptance", ".3f"), ("tau", ".3f"),
                     ("lr", ".2e"), ("tokens_per_s", ".0f")):
        if key in record and isinstance(record[key], int | float):
            parts.append(f"{key} {record[key]:{fmt}}")
    return " | ".join(parts)
