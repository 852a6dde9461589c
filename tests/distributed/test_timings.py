"""``Timings``: per-step busy/wait means with no host sync in the step (host clock on CPU)."""

from __future__ import annotations

import time

import pytest
import torch

from dflash_train.train.timings import Timings


def test_step_minus_local_phases_is_drafter_compute():
    t = Timings(torch.device("cpu"))
    for _ in range(2):
        step = t.mark()
        with t.measure("target_forward"):
            time.sleep(0.02)
        t.add("drafter_recv_wait", 0.01)  # host-measured, local: subtracted from the step
        t.add("target_wait", 5.0, local=False)  # a remote rank's own number: not subtracted
        time.sleep(0.03)
        t.span("step", step, t.mark(), local=False)
        t.steps += 1
    out = t.summary()
    assert out["target_forward_s"] == pytest.approx(0.02, abs=0.01)
    assert out["drafter_recv_wait_s"] == pytest.approx(0.01)
    assert out["target_wait_s"] == pytest.approx(5.0)
    # step ~0.05 s, minus target forward ~0.02 and recv wait 0.01 -> ~0.02 s of drafter compute
    assert out["drafter_compute_s"] == pytest.approx(0.02, abs=0.012)
    assert "step_s" not in out
    assert t.summary() == {}  # reset after each summary


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_resolve_at_summary():
    t = Timings(torch.device("cuda", torch.cuda.current_device()))
    a = torch.randn(4096, 4096, device="cuda")
    step = t.mark()
    with t.measure("target_forward"):
        for _ in range(20):
            a = a @ a.T / 4096
    t.span("step", step, t.mark(), local=False)
    t.steps += 1
    assert t.pending  # nothing resolved (no sync) until the summary
    out = t.summary()
    assert out["target_forward_s"] > 0 and out["drafter_compute_s"] >= 0
