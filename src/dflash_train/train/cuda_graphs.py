"""Training work replayed as CUDA graphs: ``GraphedCall`` (a function of fixed-shape tensors, one
graph per input shape: the frozen target's forward) and ``GraphedStep`` (the drafter's whole
optimizer step, below).

Why: on the H200 the SmolLM2 recipe's steps were bound by the host, not the GPU. The frozen
target's eager Hugging Face forward (28 layers of small kernels, for 16 rows of 512 tokens) took
~90 ms of host time per step under torch.profiler for ~13 ms of GPU work (random-weight SmolLM2,
`docs/results/smollm2-h200-6`). Its inputs have one shape per run (packed rows of
``data.max_length``), so the whole forward is captured once and replayed: one launch. Measured in
training: the first epoch went from 104.6K to 253.8K context tokens/s (README, "fifth run").

``GraphedCall(fn)`` copies the arguments into static buffers, replays, and returns CLONES of the
outputs (the next replay overwrites the static ones while a caller may still hold the last).
``fn`` must read only its tensor arguments (and fixed state such as frozen weights) and must
not synchronize with the host. Any failure while capturing is reported once and the call runs
eagerly from then on: a graph is an optimization, never a requirement.

``capture`` is injectable: the CPU tests pass one that "replays" by calling ``fn`` on the static
buffers, which checks the buffer and clone plumbing that CUDA uses.

With the target graphed, the drafter's step was the host-bound part (~30 ms of wall time for 14.5 ms
of GPU work: hundreds of compiled-kernel launches per layer call); ``GraphedStep`` replays it whole
(a cached step 50.0 -> 14.9 ms, README "sixth run").
"""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import torch

from dflash_train.devices import graph_capture


class GraphedCall:
    def __init__(self, fn, name: str, capture=None, max_shapes: int = 4):
        from dflash_train.decoding.cache import capture_cuda_graph

        self.fn, self.name = fn, name
        self.capture = capture or capture_cuda_graph
        self.max_shapes = max_shapes
        self.graphs: dict[tuple, tuple] = {}  # shapes -> (static inputs, graph, static outputs)
        self.enabled = True
        self.replays = 0

    def _key(self, args) -> tuple:
        return tuple((tuple(a.shape), a.dtype, a.device) for a in args)

    def _record(self, key, args):
        buffers = tuple(a.clone() for a in args)
        graph, outputs = self.capture(lambda: self.fn(*buffers))
        self.graphs[key] = (buffers, graph, outputs)
        return self.graphs[key]

    def __call__(self, *args):
        if not self.enabled:
            return self.fn(*args)
        key = self._key(args)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= self.max_shapes:
                return self.fn(*args)  # shapes that vary: not what graphs are for
            try:
                entry = self._record(key, args)
            except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
                _capture_failed(self.name, err)
                self.enabled = False
                self.graphs.clear()
                return self.fn(*args)
        buffers, graph, outputs = entry
        for buffer, arg in zip(buffers, args):
            buffer.copy_(arg, non_blocking=True)
        graph.replay()
        self.replays += 1
        return _clone(outputs)


def capture_step(fn):
    """``(graph, outputs)``: a CUDA graph of ``fn()``, recorded, NOT run (a training step must not
    run twice; the first replay runs it).

    ``thread_local``: the prefetching thread may pin host memory while this thread captures;
    the default ``global`` mode would count that as an unsafe call inside the capture.
    """
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph, capture_error_mode="thread_local"):
        outputs = fn()
    return graph, outputs


class GraphedStep:
    """A whole training step (``body(inputs, context, step_number)``: forward, loss, backward,
    clipping, fused AdamW) replayed as ONE CUDA graph: one launch instead of the host launching
    every kernel of every drafter layer (the SmolLM2 step had 14.5 ms of GPU work in ~30 ms of
    wall time: README, "fifth run").

    How a step is made replayable (PyTorch's "whole-network capture"):

    * inputs and context features are copied into static buffers the graph reads; the step
      number too (a device scalar), and the learning rate: while ``body`` runs, each param
      group's ``lr`` is a device tensor that mirrors the schedule's float (refilled before each
      step), so the fused AdamW kernel reads the current LR instead of the one captured;
    * the first ``eager_steps`` steps run eagerly (compilation, the optimizer's lazy state,
      library workspaces; the last on a side stream, as capture wants), each followed by
      ``zero_grad(set_to_none=True)``. The capture then starts with no gradients, so backward
      ALLOCATES them inside the graph's pool: every replay overwrites them with the step's
      fresh gradients (nothing accumulates, no reset needed);
    * outputs are cloned after each replay (the next replay overwrites them).

    Capturing records the step without running it; the first replay runs it. A capture
    failure is reported once and every later step runs ``body`` eagerly, as does a step whose
    input shapes differ from the captured ones (its gradients start from none, as in eager
    training). ``capture(fn) -> (graph, outputs)`` is injectable: CPU tests pass one whose
    ``replay`` runs ``fn`` and writes its outputs in place.
    """

    def __init__(self, body, optimizer, eager_steps: int = 2, capture=None, name: str = "training step"):
        self.body, self.optimizer, self.name = body, optimizer, name
        self.eager_steps = max(1, eager_steps)
        self.capture = capture or capture_step
        self.graph = None
        self.enabled = True
        self.calls = self.replays = 0
        self.static = None  # (inputs, context) buffers
        self.step_number = self.lrs = self.outputs = None

    def _allocate(self, inputs, context) -> None:
        """The static buffers, shaped like the first step's values."""
        self.static = (tuple(torch.empty_like(t) for t in inputs), torch.empty_like(context))
        self.step_number = torch.zeros((), device=context.device)
        self.lrs = [torch.zeros((), device=context.device) for _ in self.optimizer.param_groups]

    def _matches(self, inputs, context) -> bool:
        buffers, values = (*self.static[0], self.static[1]), (*inputs, context)
        return len(buffers) == len(values) and all(
            b.shape == v.shape and b.dtype == v.dtype and b.device == v.device for b, v in zip(buffers, values))

    def _refill_lrs(self) -> None:
        """Each group's LR tensor := the schedule's current float (a fill kernel, no host copy)."""
        for lr, group in zip(self.lrs, self.optimizer.param_groups):
            lr.fill_(float(group["lr"]))

    def _stage(self, inputs, context, step_number: int) -> None:
        """Copy this step's values into the static buffers."""
        for buffer, value in zip((*self.static[0], self.static[1]), (*inputs, context)):
            buffer.copy_(value, non_blocking=True)
        self.step_number.fill_(float(step_number))
        self._refill_lrs()

    def _run_body(self, inputs, context, step_number):
        """``body``, each group's LR read from its device tensor."""
        groups = self.optimizer.param_groups
        saved = [(g["lr"], g.get("capturable", False)) for g in groups]
        try:
            for group, lr in zip(groups, self.lrs):
                group["lr"] = lr
                group["capturable"] = context.is_cuda or group.get("capturable", False)
            return self.body(inputs, context, step_number)
        finally:
            for group, (lr, capturable) in zip(groups, saved):
                group["lr"], group["capturable"] = lr, capturable

    def _eager(self, inputs, context, step_number, side_stream: bool = False):
        """One step run now (gradients from none to none, as the trainer's eager step)."""
        self.optimizer.zero_grad(set_to_none=True)
        if side_stream and context.is_cuda:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                out = self._run_body(inputs, context, step_number)
            torch.cuda.current_stream().wait_stream(stream)
        else:
            out = self._run_body(inputs, context, step_number)
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def _record(self) -> bool:
        try:
            self.graph, self.outputs = self.capture(lambda: self._run_body(*self.static, self.step_number))
            return True
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
            _capture_failed(self.name, err)
            self.enabled, self.graph, self.outputs = False, None, None
            return False

    def __call__(self, inputs, context, step_number: int):
        self.calls += 1
        if self.static is None:
            self._allocate(inputs, context)
        if not self._matches(inputs, context):  # another shape: this step runs eagerly on its own tensors
            self._refill_lrs()
            return self._eager(inputs, context, torch.full((), float(step_number), device=context.device))
        self._stage(inputs, context, step_number)
        if not self.enabled or (self.graph is None and self.calls <= self.eager_steps):
            return self._eager(*self.static, self.step_number, side_stream=self.calls == self.eager_steps)
        if self.graph is None and not self._record():
            return self._eager(*self.static, self.step_number)
        self.graph.replay()
        self.replays += 1
        return _clone(self.outputs)


def _capture_failed(name: str, err: BaseException) -> None:
    """Let a broken capture's work drain, then say once what failed and where (eager from now on)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    first_line = str(err).splitlines()[0] if str(err) else ""
    warnings.warn(f"{name}: CUDA graph capture failed ({type(err).__name__}: {first_line}, at {_where(err)}); "
                  "running it eagerly", stacklevel=4)


def _where(err: BaseException) -> str:
    """The innermost frames of ``err`` that are this package's, and the one that raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if "dflash_train" in f.filename][-2:]
    shown = ours + [frames[-1]] if frames and (not ours or ours[-1] is not frames[-1]) else ours
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} ({f.name})" for f in reversed(shown)) or "?"


def _clone(value):
    """Clones of the tensors in nested tuples/lists/dataclasses (a graph's outputs; None stays)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return type(value)(**{k: _clone(v) for k, v in vars(value).items()})
    return value
