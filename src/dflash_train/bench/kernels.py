"""Where a training step's device time goes, kernel by kernel, phase by phase (``bench --kernels N``).

The bench's phase times say *which* phase is slow; this says *what* in it: one extra step runs
under ``torch.profiler`` with the same synchronized phase boundaries as the profiled pass, each
phase inside a named range (``bench_phase_<i>``). A kernel belongs to the phase whose range holds
its start: the synchronization at every boundary means a phase's kernels start after its range
opens and end before it closes. Kernels are grouped into a few categories by name (``category``):
the matmuls, attention, Inductor's fused kernels, the optimizer's, copies and the rest, which is how one reads
"the target forward is half matmuls" or "the drafter forward is waiting on elementwise work".

On the CPU there are no kernels; the same bookkeeping runs over the leaf operators' self CPU
time (``aten::mm`` and the like), which is what lets a CPU test exercise it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

RANGE_PREFIX = "bench_phase_"

# (category, substrings of a kernel or operator name, lower case); the first match wins (Inductor's
# ``triton_`` kernels are sorted by ``category`` before these)
CATEGORIES = (
    ("attention", ("flex_attention", "flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "scaled_mm", "aten::mm", "aten::bmm",
                "aten::addmm", "aten::linear", "aten::matmul", "grouped_mm")),
    ("optimizer", ("adam", "multi_tensor_apply", "muon", "newton_schulz")),
    ("copy", ("memcpy", "memset", "aten::copy_", "aten::to", "aten::clone", "aten::contiguous")),
    ("reduction", ("reduce", "aten::sum", "aten::mean", "aten::max", "logsumexp", "softmax", "norm")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "aten::mul", "aten::add", "aten::div",
                     "aten::sub", "aten::exp", "aten::where", "aten::fill_", "aten::zero_")),
)


def category(name: str) -> str:
    """The category of a kernel (or CPU operator) by its name; ``other`` when nothing matches.

    Inductor names a kernel after the operators it fused (``triton_red_fused__scaled_mm_...amax``
    is FP8 quantization feeding a matmul, not one): its templates (``triton_tem``) are matmuls or
    flex attention, every other ``triton_`` kernel is fused pointwise or reduction work."""
    low = name.lower()
    if low.startswith("triton_"):
        if low.startswith("triton_tem"):
            return "attention" if "flex" in low else "matmul"
        return "fused (Inductor)"
    for label, needles in CATEGORIES:
        if any(n in low for n in needles):
            return label
    return "other"


@dataclass
class PhaseKernels:
    """One phase's device time: total, per category, per kernel name ([count, microseconds])."""

    us: float = 0.0
    categories: dict[str, float] = field(default_factory=dict)
    names: dict[str, list] = field(default_factory=dict)

    def add(self, name: str, us: float) -> None:
        self.us += us
        label = category(name)
        self.categories[label] = self.categories.get(label, 0.0) + us
        entry = self.names.setdefault(name[:120], [0, 0.0])
        entry[0] += 1
        entry[1] += us

    def report(self, top: int) -> dict:
        ranked = sorted(self.names.items(), key=lambda kv: -kv[1][1])[:top]
        return {"us": round(self.us, 1),
                "categories": {k: round(v, 1) for k, v in sorted(self.categories.items(), key=lambda kv: -kv[1])},
                "top": [{"name": n, "count": c, "us": round(us, 1), "category": category(n)} for n, (c, us) in ranked]}


def attribute(ranges: list[tuple[str, float, float]], items: list[tuple[str, float, float]]) -> dict[str, PhaseKernels]:
    """``items`` (name, start, microseconds) into the phase ``ranges`` (phase, start, end) holding
    their start; an item outside every range goes to ``outside`` (launch gaps, the profiler's own)."""
    phases: dict[str, PhaseKernels] = {}
    for name, start, us in items:
        phase = next((p for p, begin, end in ranges if begin <= start < end), "outside")
        phases.setdefault(phase, PhaseKernels()).add(name, us)
    return phases


def _items(prof, device: torch.device) -> tuple[list, list, str]:
    """(phase ranges, timed items, what the items are) from a finished profiler."""
    events = prof.events()
    ranges = [(e.name, e.time_range.start, e.time_range.end) for e in events if e.name.startswith(RANGE_PREFIX)]
    if device.type == "cuda":
        items = [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA and not is_annotation(e)]
        return ranges, items, "CUDA kernels, memcpy and memset (device time)"
    items = [(e.name, e.time_range.start, e.self_cpu_time_total) for e in events
             if e.name.startswith("aten::") and e.self_cpu_time_total > 0]
    return ranges, items, "CPU operators (self time; no kernels on the CPU)"


def is_annotation(event) -> bool:
    """A named range mirrored on the device timeline (ours, ``Optimizer.step#AdamW.step``): it spans
    kernels, it is not one, so counting it would count their time twice."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(RANGE_PREFIX)


def profile_step(run_step: Callable[[Callable[[str], None]], object], device: torch.device,
                 synchronize: Callable[[torch.device], None], top: int = 10) -> dict:
    """Run ``run_step(mark)`` once under the profiler, ``mark(phase)`` closing each phase (as the
    trainer's step calls it) and opening the next range; report each phase's kernels."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    names: list[str] = []
    state: dict = {}

    def open_range() -> None:
        state["range"] = record_function(f"{RANGE_PREFIX}{len(names)}")
        state["range"].__enter__()

    def mark(phase: str) -> None:
        synchronize(device)
        state["range"].__exit__(None, None, None)
        names.append(phase)
        open_range()

    synchronize(device)
    with profile(activities=activities) as prof:
        open_range()
        run_step(mark)
        synchronize(device)
        state["range"].__exit__(None, None, None)
    ranges, items, what = _items(prof, device)
    phases = attribute([(_phase_of(name, names), begin, end) for name, begin, end in ranges], items)
    order = [*names, "step", "after", "outside"]
    return {"items": what, "step_us": round(sum(p.us for p in phases.values()), 1),
            "phases": {name: phases[name].report(top) for name in order if name in phases}}


def _phase_of(range_name: str, names: list[str]) -> str:
    """``bench_phase_<i>`` -> the phase ``mark`` named when closing it; the range after the last
    mark is ``after`` (the step's tail), or ``step`` when nothing was marked (a CUDA-graphed step)."""
    index = int(range_name[len(RANGE_PREFIX):])
    if index < len(names):
        return names[index]
    return "after" if names else "step"
