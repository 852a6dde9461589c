"""``bench --kernels N`` (bench/kernels.py): each phase's device time by kernel, checked on the CPU,
where the same bookkeeping runs over the operators' self time."""

import pytest
import torch

from dflash_train.bench.job import BenchOptions, bench_job
from dflash_train.bench.kernels import PhaseKernels, attribute, category, profile_step
from dflash_train.bench.run import PHASES, run_bench
from dflash_train.devices import synchronize


@pytest.mark.parametrize(("name", "expected"), [
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "matmul"),
    ("triton_tem_fused_flex_attention_0", "attention"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "fused (Inductor)"),
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "elementwise"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("aten::mm", "matmul"),
    ("triton_red_fused__scaled_mm__to_copy_abs_amax_clamp_div_mul_silu_t_view_5", "fused (Inductor)"),
    ("triton_per_fused__scaled_dot_product_cudnn_attention__to_copy_add_cat_mean_mul_neg_pow", "fused (Inductor)"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("something_else", "other"),
])
def test_kernel_categories(name, expected):
    assert category(name) == expected


def test_attribute_puts_each_item_in_the_range_holding_its_start():
    """A brute-force check of the interval lookup: items at range edges go to the range they open."""
    ranges = [("prepare", 0.0, 10.0), ("target_forward", 10.0, 30.0), ("optimizer", 30.0, 35.0)]
    items = [("aten::mm", 0.0, 4.0), ("aten::add", 9.9, 1.0), ("aten::mm", 10.0, 15.0), ("aten::mm", 29.0, 2.0),
             ("aten::mul", 30.0, 1.0), ("aten::mm", 40.0, 3.0)]
    phases = attribute(ranges, items)
    expected = {}
    for name, start, us in items:
        phase = "outside"
        for label, begin, end in ranges:
            if begin <= start < end:
                phase = label
        expected.setdefault(phase, PhaseKernels()).add(name, us)
    assert {k: (v.us, v.names) for k, v in phases.items()} == {k: (v.us, v.names) for k, v in expected.items()}
    assert phases["target_forward"].report(1)["top"] == [
        {"name": "aten::mm", "count": 2, "us": 17.0, "category": "matmul"}]


def test_profile_step_splits_a_marked_step_into_its_phases():
    """A two-phase step of known work: the matmuls land in the phase that ran them, none elsewhere."""
    a = torch.randn(256, 256)

    def run(mark):
        for _ in range(3):
            a @ a
        mark("first")
        (a + 1).sum()
        mark("second")

    out = profile_step(run, torch.device("cpu"), synchronize, top=3)
    assert list(out["phases"])[:2] == ["first", "second"]
    first, second = out["phases"]["first"], out["phases"]["second"]
    assert first["categories"].get("matmul", 0) > 0 and "matmul" not in second["categories"]
    assert [t["count"] for t in first["top"] if t["name"] == "aten::mm"] == [3]
    assert out["step_us"] == pytest.approx(sum(p["us"] for p in out["phases"].values()), abs=0.1 * len(out["phases"]))


def _tiny_job(*overrides: str):
    return bench_job(None, ["train.num_anchors=8", *overrides], "tiny")


def test_bench_kernels_reports_every_phase_of_the_trainers_step():
    """``--kernels``: one more step after the timed and profiled ones, every phase of the trainer's step
    present (the matmuls of the target forward among its operators), the timed numbers unchanged."""
    job, base = _tiny_job(), dict(steps=2, warmup=1, profile_steps=1, device="cpu")
    plain = run_bench(job, BenchOptions(**base), log=lambda *_: None)
    result = run_bench(job, BenchOptions(**base, kernels=4), log=lambda *_: None)
    phases = result["kernels"]["phases"]
    assert set(PHASES) <= set(phases), list(phases)
    assert phases["target_forward"]["categories"].get("matmul", 0) > 0
    assert all(len(p["top"]) <= 4 for p in phases.values())
    assert "kernels" not in plain
    assert result["last_loss"] == pytest.approx(plain["last_loss"], rel=1e-6)
    with pytest.raises(ValueError, match="--kernels"):
        BenchOptions(**base, kernels=-1).resolved(job)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphed", [False, True], ids=["phases", "cuda-graph-step"])
def test_cuda_kernels_land_in_their_phases(graphed):
    """On CUDA the items are the kernels (their device time, by the profiler's clock shared with the
    phase ranges): every phase holds kernels, the matmuls of the target forward among them, and the
    kernels' total is of the order of the profiled step. A graphed step has no phases: one ``step``."""
    job = _tiny_job(f"train.cuda_graph_step={str(graphed).lower()}")
    result = run_bench(job, BenchOptions(steps=3, warmup=2, profile_steps=1, device="cuda", kernels=5),
                       log=lambda *_: None)
    kernels = result["kernels"]
    assert kernels["items"].startswith("CUDA kernels")
    names = [k["name"] for phase in kernels["phases"].values() for k in phase["top"]]
    ranges = [n for n in names if n.startswith("bench_phase_") or n.startswith("Optimizer.step#")]
    assert not ranges, names  # named ranges span kernels: they are not kernels themselves
    if graphed:
        assert "step" in kernels["phases"] and kernels["step_us"] > 0
        return
    phases = kernels["phases"]
    assert set(PHASES) <= set(phases), list(phases)
    assert phases["target_forward"]["categories"].get("matmul", 0) > 0
    assert phases["optimizer"]["categories"].get("optimizer", 0) > 0
    # the kernels of one stream, synchronized at each phase boundary, fit in the step's wall time
    assert 0 < kernels["step_us"] / 1e6 / result["profiled_step_s"] < 1.05  # the tiny step is host-bound: ~4%
