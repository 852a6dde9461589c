"""CUDA-graph capture never runs Python's garbage collector (``devices.graph_capture``).

Forced on the CPU: ``torch.cuda``'s graph and stream calls are replaced by fakes that record
whether the collector could run while ``fn`` was captured. On an H200 a collection inside a
capture freed an earlier decoder's graph and invalidated the capture; torch no longer collects
before capturing, so our capture sites must (and then hold collection off)."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

from dflash_train.decoding.cache import capture_cuda_graph
from dflash_train.train.cuda_graphs import capture_step


class _Cycle:
    def __init__(self):
        self.me = self


@pytest.fixture
def fake_cuda(monkeypatch):
    """Fake graph/stream calls; returns the list of ``gc.isenabled()`` seen inside captures."""
    seen = []

    @contextlib.contextmanager
    def graph(_graph, **_kwargs):
        seen.append(gc.isenabled())
        yield
        seen.append(gc.isenabled())

    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: type("S", (), {"wait_stream": lambda self, s: None})())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"wait_stream": lambda self, s: None})())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    return seen


@pytest.mark.parametrize("capture", [capture_cuda_graph, capture_step], ids=["decoding", "training"])
def test_capture_collects_first_then_holds_collection_off(fake_cuda, capture):
    garbage = _Cycle()
    dead = weakref.ref(garbage)
    del garbage  # in a cycle: only a collection frees it
    assert gc.isenabled()
    _, out = capture(lambda: torch.ones(2))
    assert dead() is None  # collected before the capture began
    assert fake_cuda == [False, False]  # no automatic collection possible during the capture
    assert gc.isenabled()  # and back on afterwards
    assert out.tolist() == [1.0, 1.0]


def test_collection_is_back_on_after_a_failed_capture(fake_cuda):
    with pytest.raises(RuntimeError, match="capture broke"):
        capture_step(lambda: (_ for _ in ()).throw(RuntimeError("capture broke")))
    assert gc.isenabled()
