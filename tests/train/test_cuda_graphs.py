"""CUDA-graph replay of the target forward (train/cuda_graphs.py), with a CPU stand-in for the
capture: a "graph" whose replay recomputes its outputs IN PLACE from the static input buffers,
as a CUDA graph does. What this checks is the plumbing CUDA uses too: inputs copied into the
buffers, outputs cloned (the next replay overwrites them), one graph per shape, eager fallback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from testkit import tiny_qwen3

from dflash_train.data.batching import MicroBatch
from dflash_train.models.target import Target
from dflash_train.train.cuda_graphs import GraphedCall
from dflash_train.train.features import LocalFeatures, replays_target_forward


class InPlaceGraph:
    def __init__(self, fn, outputs):
        self.fn, self.outputs = fn, outputs

    def replay(self):
        fresh = self.fn()
        pairs = zip(self.outputs, fresh) if isinstance(fresh, tuple) else [(self.outputs, fresh)]
        for out, new in pairs:
            out.copy_(new)


def fake_capture(fn):
    fn()  # the warm-up run, as on CUDA
    outputs = fn()
    return InPlaceGraph(fn, outputs), outputs


def test_replays_equal_eager_calls_and_earlier_results_survive():
    calls = []

    def fn(x, y):
        calls.append(1)
        return x * 2 + y, x.sum(-1)

    graphed = GraphedCall(fn, "test", capture=fake_capture)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    first = graphed(a, b)
    second = graphed(b, a)  # same shape: a replay of the same graph
    torch.testing.assert_close(first[0], a * 2 + b)
    torch.testing.assert_close(first[1], a.sum(-1))  # not overwritten by the second replay
    torch.testing.assert_close(second[0], b * 2 + a)
    assert len(graphed.graphs) == 1 and graphed.replays == 2
    graphed(torch.randn(2, 4), torch.randn(2, 4))  # a new shape: a second graph
    assert len(graphed.graphs) == 2


def test_capture_failure_falls_back_to_eager_with_one_warning():
    def broken_capture(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphed = GraphedCall(lambda x: x + 1, "test", capture=broken_capture)
    with pytest.warns(UserWarning, match="capture failed"):
        out = graphed(torch.zeros(2))
    torch.testing.assert_close(out, torch.ones(2))
    torch.testing.assert_close(graphed(torch.ones(2)), torch.full((2,), 2.0))  # eager from now on
    assert not graphed.enabled


def _packed_micro_batch(seed: int) -> MicroBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (2, 12), generator=g)
    docs = torch.tensor([[5] * 4 + [9] * 6 + [-1] * 2, [3] * 12])
    return MicroBatch(ids, torch.ones_like(ids), (docs >= 0).long(), torch.tensor([5, 3]), 0, docs)


@pytest.mark.parametrize("distill", [0.0, 0.5])
def test_local_features_replayed_equal_the_eager_target(distill):
    target = Target(tiny_qwen3())
    trainer = SimpleNamespace(batches=None, target=target, drafter_cfg=SimpleNamespace(target_layer_ids=[0, 3]),
                              opts=SimpleNamespace(needs_target_distribution=bool(distill)), graph_target_forward=False)
    graphed = LocalFeatures(trainer, capture=fake_capture)
    eager = LocalFeatures(trainer)
    assert eager.graphed is None and graphed.graphed is not None  # no capture on the CPU by default
    results = []
    for seed in (0, 1):
        mb = _packed_micro_batch(seed)
        results.append((graphed.features(mb, mb.input_ids, None), eager.features(mb, mb.input_ids, None)))
    for got, want in results:
        got, want = (got, want) if distill else ((got,), (want,))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert graphed.graphed.replays == 2


@pytest.mark.parametrize("fsdp_target, graphed", [(False, True), (True, False)])
def test_cuda_graphs_are_off_for_a_target_sharded_with_fsdp(fsdp_target, graphed):
    """FSDP2 gathers the target's parameters into storage that changes between calls: a replayed
    graph would read stale memory, so a sharded target runs eagerly."""
    replays = replays_target_forward(True, fsdp_target, torch.device("cuda"))
    trainer = SimpleNamespace(batches=None, target=None, drafter_cfg=SimpleNamespace(target_layer_ids=[0]),
                              opts=SimpleNamespace(needs_target_distribution=False), graph_target_forward=replays)
    assert replays == graphed and (LocalFeatures(trainer).graphed is not None) == graphed
    assert not replays_target_forward(True, False, torch.device("cpu"))
    assert not replays_target_forward(False, False, torch.device("cuda"))
