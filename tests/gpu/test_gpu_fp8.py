"""FP8 linears on CUDA (``models/fp8.py``): ``torch._scaled_mm`` against the float32 emulation on
the same quantized operands, the compiled activation quantizer, CUDA-graph capture, the memory
the FP8 weights save, and ``bench --target-fp8``.

    python -m pytest -m gpu tests/gpu/test_gpu_fp8.py -q

Needs compute capability 8.9+ (Ada, Hopper, Blackwell); elsewhere the FP8 tests skip and the
refusal is checked instead. CPU tests of the same module: ``tests/models/test_fp8.py``.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
from pathlib import Path

import pytest
import torch
from testkit import fp8_drafter_grads, tiny_qwen3
from torch import nn

from dflash_train.models import fp8
from dflash_train.models.fp8 import FP8Linear, emulated_mm, quantize_rows
from dflash_train.models.target import Target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
HAS_FP8 = torch.cuda.is_available() and fp8.native_fp8("cuda")
needs_fp8 = pytest.mark.skipif(not HAS_FP8, reason="needs FP8 tensor cores (compute capability 8.9+)")
LINEAR_RMS_BOUND = 2.0**-4 * math.sqrt(2 / 3)  # tests/models/test_fp8.py derives it
BF16_ULP = 2.0**-8  # bf16 keeps 8 significant bits: one rounding moves a value by at most 2^-9, two by 2^-8
ACCUMULATOR_ULP = 2.0**-13  # FP8 tensor-core accumulation keeps ~14 significant bits


def rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).norm() / ref.double().norm()).item()


@needs_fp8
@pytest.mark.parametrize("m, k, n", [(300, 4096, 1536), (16, 512, 512), (1, 1024, 2048)])
def test_scaled_mm_equals_the_emulation_on_the_same_operands(m, k, n):
    """The kernel and the emulation multiply the same e4m3 values with fp32 accumulation and
    scale the same way: they differ by the order of the sums and bf16's output rounding only."""
    g = torch.Generator(device="cuda").manual_seed(0)
    qa, sa = quantize_rows(torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16))
    qw, sw = quantize_rows(torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02)
    sw = sw.reshape(1, -1).contiguous()
    native = fp8.scaled_mm(qa, sa, qw, sw)
    exact = emulated_mm(qa, sa, qw, sw, torch.float32)
    assert native.dtype == torch.bfloat16 and native.shape == (m, n)
    # Hopper's FP8 tensor cores accumulate with ~14 significant bits between promotions to fp32
    # (DeepSeek-V3 report, section 3.3.2), so the sum's error scales with the sum of |products|, not
    # with |result|: near-zero outputs of a long, cancelling sum differ most (seen at k = 512 with
    # the bound relative to |result|). Output rounding: half a bf16 step of |result|.
    magnitude = (qa.float().abs() @ qw.float().abs().t()) * sa * sw
    assert ((native.float() - exact).abs() <= BF16_ULP * exact.abs() + ACCUMULATOR_ULP * magnitude).all()


@needs_fp8
def test_fp8_linear_on_cuda_is_the_emulation_and_within_the_bound():
    torch.manual_seed(0)
    linear = nn.Linear(4096, 1536, bias=True, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(3, 100, 4096, device="cuda", dtype=torch.bfloat16)
    layer = FP8Linear.from_linear(linear)
    with torch.no_grad():
        native = layer(x)
        layer.emulate = True
        emulated = layer(x)
        ref = nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float())
    assert native.dtype == torch.bfloat16 and native.shape == (3, 100, 1536)
    assert rel_rms(native, emulated) < 2 * BF16_ULP
    assert rel_rms(native, ref) < LINEAR_RMS_BOUND + BF16_ULP


@needs_fp8
def test_compiled_quantizer_matches_the_eager_one():
    x = torch.randn(257, 4096, device="cuda", dtype=torch.bfloat16) * 3
    q_eager, s_eager = quantize_rows(x)
    q_comp, s_comp = fp8._compiled_quantizer(x)
    assert not fp8._compiled_quantizer.failed
    assert torch.equal(s_eager, s_comp)
    same = (q_eager.float() == q_comp.float()).float().mean().item()
    assert same > 0.999  # a division fused differently may round a rare tie the other way


@needs_fp8
def test_fp8_linear_captures_in_a_cuda_graph():
    """The trainer replays the target's forward as a CUDA graph (train.cuda_graphs): quantizing and
    the FP8 product must capture (no host sync) and replay to the eager result."""
    from dflash_train.decoding.cache import capture_cuda_graph

    torch.manual_seed(0)
    layer = FP8Linear.from_linear(nn.Linear(1024, 2048, device="cuda", dtype=torch.bfloat16))
    static = torch.randn(2, 64, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = layer(static)
        graph, out = capture_cuda_graph(lambda: layer(static))
        static.copy_(torch.randn_like(static))
        expected = layer(static)
        graph.replay()
    torch.cuda.synchronize()
    assert rel_rms(eager, expected) > 0.5  # the replay read the new input
    assert rel_rms(out, expected) < 1e-3  # the same kernels, replayed (a different cuBLAS pick rounds differently)


@needs_fp8
def test_target_memory_drops_by_half_the_projection_weights():
    target = Target(tiny_qwen3(num_layers=4, hidden=1024, vocab=256).to("cuda", torch.bfloat16))
    projections = [m for m in target.layers.modules() if type(m) is nn.Linear]
    bf16_bytes = sum(m.weight.nbytes for m in projections)
    fp8_bytes = sum(m.out_features * m.in_features + m.out_features * 4 for m in projections)  # + fp32 scales
    del projections
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    target.use_fp8_linears()
    gc.collect()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    saved = before - after
    assert saved >= 0.95 * (bf16_bytes - fp8_bytes), (saved, bf16_bytes, fp8_bytes)
    assert saved <= bf16_bytes


@needs_fp8
def test_tiny_target_features_on_cuda():
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 64), device="cuda")
    ref = Target(tiny_qwen3(num_layers=6).to("cuda", torch.bfloat16))
    low = Target(tiny_qwen3(num_layers=6).to("cuda", torch.bfloat16))
    low.use_fp8_linears()
    a, b = low.features(ids, None, [1, 3, 5]), ref.features(ids, None, [1, 3, 5])
    for k in range(3):
        x, y = a[..., k * 64:(k + 1) * 64].float(), b[..., k * 64:(k + 1) * 64].float()
        assert rel_rms(x, y) < 0.1
        assert torch.nn.functional.cosine_similarity(x.reshape(-1, 64), y.reshape(-1, 64), dim=-1).min() > 0.99


@pytest.mark.skipif(HAS_FP8, reason="checks the refusal on a GPU without FP8 tensor cores")
def test_a_gpu_without_fp8_is_refused():
    target = Target(tiny_qwen3(num_layers=1).to("cuda", torch.bfloat16))
    with pytest.raises(ValueError, match="no FP8 tensor cores"):
        target.use_fp8_linears()


@needs_fp8
def test_bench_target_fp8_on_cuda():
    from dflash_train.cli import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["bench", "train.num_anchors=8", "--target-config", "tiny", "--steps", "2", "--warmup", "2",
                   "--device", "cuda", "--matmul-size", "2048", "--target-fp8"])
    assert rc == 0
    result = json.loads(stdout.getvalue())
    assert result["config"]["target"]["fp8_linear"] is True and result["config"]["bench"]["target_fp8_linears"] == 8 * 7
    assert math.isfinite(result["last_loss"]) and result["recompiles_after_warmup"] == 0
    assert result["matmul_ceiling_fp8_tflops"] > 0  # the FP8 product measured beside the bf16 one
    assert result["mfu_vs_fp8_ceiling"] * result["matmul_ceiling_fp8_tflops"] == pytest.approx(result["achieved_tflops"])


# -- the drafter's FP8 training linears (train.fp8_drafter) -----------------------------------------
def _fp8_linear_grads(layer, x, gy):
    x = x.clone().requires_grad_()
    layer.weight.grad = None
    y = layer(x)
    y.backward(gy)
    return y.detach(), x.grad, layer.weight.grad.clone()


@needs_fp8
@pytest.mark.parametrize("m, k, n", [(300, 1024, 1536), (4096, 512, 256), (17, 256, 512)])
def test_training_linear_on_cuda_is_the_emulation_forward_and_backward(m, k, n):
    """``_scaled_mm`` for all three GEMMs (M = 300 and 17 pad the weight gradient's reduction) against
    the emulation on the same quantized operands: the same values up to bf16's output rounding and the
    tensor cores' accumulation order; both within the derived bound of the float product."""
    from dflash_train.models.fp8 import FP8TrainingLinear

    torch.manual_seed(0)
    linear = nn.Linear(k, n, bias=False, device="cuda")  # float32 master weight, as in training
    native = FP8TrainingLinear.from_linear(linear)
    emulated = FP8TrainingLinear.from_linear(linear, emulate=True)
    assert not native.emulate
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = _fp8_linear_grads(native, x, gy)
        exp = _fp8_linear_grads(emulated, x, gy)
    xf = x.float().requires_grad_()
    ref_y = xf @ linear.weight.t()
    ref_x, ref_w = torch.autograd.grad(ref_y, [xf, linear.weight], gy.float())
    for name, a, b, ref in zip(("y", "grad_x", "grad_w"), got, exp, (ref_y.detach(), ref_x, ref_w)):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert rel_rms(a, b) < 2 * BF16_ULP, (name, rel_rms(a, b))
        assert rel_rms(a, ref) < LINEAR_RMS_BOUND + BF16_ULP, (name, rel_rms(a, ref))
    assert got[0].dtype == torch.bfloat16 and got[2].dtype == torch.float32


@needs_fp8
def test_compiled_fp8_drafter_gradients_equal_eager_and_near_bf16():
    """``_scaled_mm`` inside compiled drafter layers: every parameter's gradient as the eager FP8
    drafter's and near the bf16 drafter's. The FP8 GEMMs written as a ``torch.autograd.Function``
    traced by Inductor (torch 2.11) gave a correct forward and all-zero layer gradients here
    (relative error 1.0 for every parameter but the final norm); as custom operators they do not."""
    eager_out, eager = fp8_drafter_grads("cuda", fp8=True, compile=False)
    out, compiled = fp8_drafter_grads("cuda", fp8=True, compile=True)
    _, bf16 = fp8_drafter_grads("cuda", fp8=False, compile=True)
    assert rel_rms(out, eager_out) < 2 * LINEAR_RMS_BOUND
    for name, grad in eager.items():
        assert rel_rms(compiled[name], grad) < 4 * LINEAR_RMS_BOUND, name
        assert rel_rms(compiled[name], bf16[name]) < 4 * LINEAR_RMS_BOUND, name


def _fp8_chat_job(tmp_path, name, **train):
    from testkit import tiny_chat_job

    job = tiny_chat_job(tmp_path / name, max_steps=14, device="cuda", num_anchors=16, log_every=1,
                        loggers=["jsonl"], **train)
    job["data"]["pack"] = True
    job["target"]["dtype"] = "bfloat16"
    return job


def _train_fp8_job(job, tmp_path, name):
    from testkit import tiny_chat_target

    from dflash_train.config import config_from_dict
    from dflash_train.models.fp8 import FP8TrainingLinear
    from dflash_train.train.trainer import Trainer

    target = tiny_chat_target(Path(__file__).resolve().parents[2] / "assets" / "smollm2")
    target.model.to("cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    cfg = config_from_dict(job)
    cfg.validate()
    trainer = Trainer(cfg, target=target, echo=lambda *a: None)
    swapped = sum(isinstance(m, FP8TrainingLinear) for m in trainer.drafter.modules())
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r], trainer, swapped


@needs_fp8
def test_fp8_drafter_compiled_cuda_graph_step_equals_eager_and_tracks_bf16(tmp_path):
    """``train.fp8_drafter`` through the trainer: compiled drafter layers (the FP8 custom
    operators inside them, ``_scaled_mm`` in forward and backward), the whole step replayed as one CUDA
    graph after two eager steps; its losses equal the eager FP8 step's, fall, and stay close to the
    bf16 run's (the same job without FP8)."""
    out = {}
    for name, fp8_on, graphed in (("bf16", False, False), ("eager", True, False), ("graphed", True, True)):
        job = _fp8_chat_job(tmp_path, name, fp8_drafter=fp8_on, cuda_graph_step=graphed)
        losses, trainer, swapped = _train_fp8_job(job, tmp_path, name)
        assert swapped == (7 if fp8_on else 0)
        assert (trainer.step.graph is not None) == graphed
        out[name] = losses
        if graphed:
            assert trainer.step.graph.enabled and trainer.step.graph.replays >= 12
    torch.testing.assert_close(torch.tensor(out["graphed"]), torch.tensor(out["eager"]), rtol=2e-3, atol=2e-3)
    fp8_curve, bf16_curve = out["eager"], out["bf16"]
    assert sum(fp8_curve[-4:]) < 0.8 * sum(fp8_curve[:4]), fp8_curve
    for a, b in zip(fp8_curve, bf16_curve):
        assert abs(a - b) <= 0.05 * b, (fp8_curve, bf16_curve)


@needs_fp8
def test_bench_drafter_fp8_on_cuda():
    from dflash_train.cli import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["bench", "train.num_anchors=8", "--target-config", "tiny", "--steps", "2", "--warmup", "2",
                   "--device", "cuda", "--matmul-size", "2048", "--drafter-fp8", "--drafter-layers", "2"])
    assert rc == 0
    result = json.loads(stdout.getvalue())
    assert result["config"]["train"]["fp8_drafter"] is True and result["config"]["bench"]["drafter_fp8_linears"] == 2 * 7
    assert math.isfinite(result["last_loss"]) and result["recompiles_after_warmup"] == 0
