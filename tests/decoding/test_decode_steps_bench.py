"""The step benchmark runs on CPU, reports every key per variant, and isolates failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_train.bench import decode_steps as bench_steps

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
STEP_KEYS = {"median_ms", "p10_ms", "p90_ms", "n"}


@pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="assets/smollm2 missing")
def test_bench_steps_cpu_smoke(tmp_path, capsys):
    """``cudagraph`` cannot run on CPU: its error must be recorded while ``eager`` still reports."""
    out = tmp_path / "steps.json"
    report = bench_steps.main(["--target", str(SMOLLM2), "--device", "cpu", "--dtype", "float32", "--out", str(out),
                               "--variants", "eager,cudagraph", "--replays", "3", "--prompt-len", "8",
                               "--new-tokens", "6", "--block-size", "4", "--drafter-layers", "1"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    eager = report["variants"]["eager"]
    for step in ("plain", "verify", "draft"):
        assert set(eager[step]) == STEP_KEYS and eager[step]["n"] == 3
        assert 0 < eager[step]["p10_ms"] <= eager[step]["median_ms"] <= eager[step]["p90_ms"]
    ratio = eager["verify"]["median_ms"] / eager["plain"]["median_ms"]
    assert eager["verify_over_plain"] == pytest.approx(ratio)
    assert eager["break_even_tau"] == pytest.approx(ratio + eager["draft"]["median_ms"] / eager["plain"]["median_ms"])
    assert eager["decode_loop"]["same_tokens_as_plain"] is True  # random drafter, greedy: lossless
    assert set(eager["decode_loop"]) >= {"draft_ms_per_step", "verify_ms_per_step", "plain_ms_per_token"}
    assert eager["kernels_uncompiled"] == {"plain": None, "verify": None, "draft": None}  # CUDA only
    assert "needs a CUDA target" in report["variants"]["cudagraph"]["error"]
    assert "eager" in capsys.readouterr().out


def test_rank_kernels_counts_totals_and_orders_by_time():
    """The decode bench's kernel table (``rank_kernels``, shared with ``bench --kernels``) against a
    plain tally: per name its count and summed time, the largest totals first, cut at ``top``."""
    events = [("nvjet_a", 5.0), ("triton_poi_fused_add_0", 1.0), ("nvjet_a", 7.0), ("Memset (Device)", 0.5),
              ("triton_poi_fused_add_0", 2.0), ("cudnn_sdpa_flash", 4.0)]
    out = bench_steps.rank_kernels(events, top=2)
    tally = {}
    for name, us in events:
        count, total = tally.get(name, (0, 0.0))
        tally[name] = (count + 1, total + us)
    best = sorted(tally.items(), key=lambda kv: -kv[1][1])[:2]
    assert out["kernels"] == len(events) and out["gpu_us"] == sum(us for _, us in events)
    assert [(t["name"], t["count"], t["us"]) for t in out["top"]] == [(n, c, us) for n, (c, us) in best]
    assert out["categories"] == {"matmul": 12.0, "attention": 4.0, "fused (Inductor)": 3.0, "copy": 0.5}
