"""Where a step's time goes, per role, with no host sync inside the step.

Colocated ranks split a step into the target's forward and the drafter's compute; in the
disaggregated topology a drafter also waits to receive features and a target waits for
requests. ``Timings`` collects those spans; the trainer adds their per-step means to every
training record (``metrics.jsonl``: ``target_forward_s``, ``drafter_compute_s``, ...).
"""

from __future__ import annotations

import contextlib
import time

import torch


class Timings:
    """Seconds spent per phase since the last log line, reported as per-step means.

    No host synchronization in the step: on CUDA a phase is timed with a pair of CUDA events
    recorded on the current stream (GPU time of the work between them), and the events are
    resolved once per log line (``summary``), where the logger synchronizes anyway to read
    the loss. On the CPU the host clock is exact (the work is synchronous). ``add`` takes
    host-measured seconds (the disaggregated receive wait, remote ranks' own timings).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.events = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.steps = 0
        self.local = 0.0  # host-measured seconds added with local=True (see add)
        self.pending: list[tuple[str, object, object, bool]] = []  # (name, start, end, local)

    def add(self, name: str, seconds: float, local: bool = True) -> None:
        """``local``: time this process spent inside a step (subtracted from drafter compute);
        remote values (the target ranks' own timings, received in the headers) are not."""
        self.sums[name] = self.sums.get(name, 0.0) + seconds
        if local:
            self.local += seconds

    def mark(self):
        """A point in time: a recorded CUDA event, or the host clock."""
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def span(self, name: str, start, end, local: bool = True) -> None:
        """Account ``start`` -> ``end`` (two marks) to ``name``, resolved in ``summary``."""
        self.pending.append((name, start, end, local))

    def _seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.events else end - start

    @contextlib.contextmanager
    def measure(self, name: str):
        start = self.mark()
        try:
            yield
        finally:
            self.span(name, start, self.mark())

    def summary(self) -> dict[str, float]:
        """Per-step means since the last call; ``drafter_compute`` = step - local phases."""
        if self.events and self.pending:
            torch.cuda.synchronize(self.device)  # once per log line: the events are done
        step_total, local = 0.0, self.local
        for name, start, end, is_local in self.pending:
            seconds = self._seconds(start, end)
            if name == "step":
                step_total += seconds
                continue
            self.sums[name] = self.sums.get(name, 0.0) + seconds
            local += seconds if is_local else 0.0
        steps = max(self.steps, 1)
        out = {f"{k}_s": v / steps for k, v in self.sums.items()}
        if self.steps:
            out["drafter_compute_s"] = max(0.0, step_total - local) / steps
        self.reset()
        return out


def format_timings(spent: dict[str, float]) -> str:
    """The console line of ``Timings.summary()``: milliseconds per step of each role."""
    return "  time/step: " + ", ".join(f"{k[:-2]} {v * 1000:.1f} ms" for k, v in sorted(spent.items()))
