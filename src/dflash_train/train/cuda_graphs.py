"""A function of fixed-shape tensors replayed as a CUDA graph, one graph per input shape.

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
"""

from __future__ import annotations

import warnings

import torch


def _clone(outputs):
    if isinstance(outputs, tuple):
        return tuple(_clone(o) for o in outputs)
    return None if outputs is None else outputs.clone()


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
                if torch.cuda.is_available():
                    torch.cuda.synchronize()  # let a broken capture's work drain before running eagerly
                self.enabled = False
                self.graphs.clear()
                warnings.warn(f"{self.name}: CUDA graph capture failed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); running it eagerly", stacklevel=2)
                return self.fn(*args)
        buffers, graph, outputs = entry
        for buffer, arg in zip(buffers, args):
            buffer.copy_(arg, non_blocking=True)
        graph.replay()
        self.replays += 1
        return _clone(outputs)
