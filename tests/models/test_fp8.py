"""FP8 linears of the frozen target (``models/fp8.py``, ``target.fp8_linear``), on the CPU.

The CPU has no FP8 matmuls, so ``FP8Linear`` runs its float32 emulation here: the same
quantized operands and the same per-row / per-column scaling as ``torch._scaled_mm``, only
the order of the fp32 accumulation differs. These tests pin the quantization (its error
bounds, derived in the module docstring), which layers are replaced, the features a tiny
target produces, the config key and the bench flag. ``tests/gpu/test_gpu_fp8.py`` checks the
``_scaled_mm`` path against the emulation and the memory saved.

Bounds (e4m3: 3 mantissa bits, so rounding to nearest moves a normal value by at most
``U = 2^-4`` of itself):

* one element: ``|x - dq(q(x))| <= U * |x|`` in e4m3's normal range, and at most half the
  subnormal spacing (``scale * 2^-10``) below it;
* a row, relative RMS: ``<= U / sqrt(3) ~= 0.036`` (the rounding error spread uniformly over
  at most ``U * |x|``);
* a linear layer's output, relative RMS: both operands' independent errors, ``<= U * sqrt(2/3)
  ~= 0.051``.
"""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch
from testkit import tiny_qwen3
from torch import nn

from dflash_train.models import fp8
from dflash_train.models.fp8 import FP8Linear, convert_linears, dequantize_rows, emulated_mm, quantize_rows
from dflash_train.models.target import Target

U = 2.0**-4  # e4m3's unit roundoff (3 mantissa bits)
ROW_RMS_BOUND = U / math.sqrt(3)  # ~0.036
LINEAR_RMS_BOUND = U * math.sqrt(2 / 3)  # ~0.051
PROJECTIONS = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj"}


def rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).norm() / ref.double().norm()).item()


def rows_of_many_magnitudes(rows: int = 64, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """Gaussian rows whose scales span 1e-4 .. 1e4: each row must get its own scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    return x * torch.logspace(-4, 4, rows)[:, None]


# -- quantization --------------------------------------------------------------------------------
def test_round_trip_error_per_element_and_per_row():
    x = rows_of_many_magnitudes()
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64, 1) and scale.dtype == torch.float32
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((64,), 448.0))  # each row's amax maps to 448
    back = dequantize_rows(q, scale)
    err = (back - x).abs()
    bound = torch.maximum(U * x.abs(), scale * 2.0**-10) * (1 + 1e-6)  # normals; subnormals; fp32 slack
    assert (err <= bound).all(), (err / bound).max()
    per_row = (back - x).norm(dim=1) / x.norm(dim=1)
    assert per_row.max() < ROW_RMS_BOUND
    assert per_row.mean() > ROW_RMS_BOUND / 3  # really quantized to 3 mantissa bits, not a no-op


def test_rowwise_scales_confine_an_outlier_to_its_row():
    """Why rowwise: one tensor-wide scale set by an outlier row pushes the other rows into
    e4m3's subnormals (spacing 2^-9 of the scale: at 1e5 times smaller they are a step or two
    wide, or zero); per-row scales leave them at full precision."""
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(1))
    x[0] *= 1e5
    q, scale = quantize_rows(x)
    rowwise = (dequantize_rows(q, scale) - x)[1:].norm() / x[1:].norm()
    tensor_scale = x.abs().max() / 448
    tensorwise = ((x / tensor_scale).to(torch.float8_e4m3fn).float() * tensor_scale - x)[1:].norm() / x[1:].norm()
    assert rowwise < ROW_RMS_BOUND
    assert tensorwise > 0.3  # ten times the rowwise error and more


def test_zero_rows_huge_rows_and_no_rows_stay_finite():
    x = torch.zeros(4, 32)
    x[1] = 3e38 * torch.linspace(-1, 1, 32)  # near float32's max: x / scale must not overflow e4m3 to NaN
    x[2, 5] = 1e-30
    q, scale = quantize_rows(x)
    back = dequantize_rows(q, scale)
    assert torch.isfinite(back).all() and torch.equal(back[0], torch.zeros(32))
    assert rel_rms(back[1], x[1]) < ROW_RMS_BOUND and back[2, 5].item() == pytest.approx(1e-30, rel=U)
    q0, s0 = quantize_rows(torch.zeros(0, 32))
    assert q0.shape == (0, 32) and s0.shape == (0, 1)


# -- the linear layer ----------------------------------------------------------------------------
@pytest.fixture
def linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(512, 384, bias=True)


def test_fp8_linear_output_within_the_derived_bound(linear):
    x = torch.randn(4, 64, 512)
    layer = FP8Linear.from_linear(linear, emulate=True)
    with torch.no_grad():
        ref, out = linear(x), layer(x)
    assert out.shape == (4, 64, 384) and out.dtype == torch.float32
    err = rel_rms(out, ref)
    assert 0.01 < err < LINEAR_RMS_BOUND
    cos = torch.nn.functional.cosine_similarity(out.reshape(-1, 384), ref.reshape(-1, 384), dim=-1)
    assert cos.min() > 0.99


def test_bf16_input_gives_bf16_output_within_the_bound(linear):
    x = torch.randn(2, 16, 512)
    layer = FP8Linear.from_linear(linear.to(torch.bfloat16), emulate=True)
    with torch.no_grad():
        out = layer(x.to(torch.bfloat16))
        ref = nn.functional.linear(x, linear.weight.float(), linear.bias.float())
    assert out.dtype == torch.bfloat16
    assert rel_rms(out, ref) < LINEAR_RMS_BOUND + 2.0**-8  # plus bf16's own rounding of the weight and output


def test_emulation_is_the_dequantized_product(linear):
    """The emulation multiplies exactly the quantized operands: dequantize both, matmul in float32."""
    x = torch.randn(3, 7, 512)
    layer = FP8Linear.from_linear(linear, emulate=True)
    qa, sa = quantize_rows(x.reshape(-1, 512))
    expected = dequantize_rows(qa, sa) @ layer.dequantized_weight().t() + linear.bias
    with torch.no_grad():
        assert torch.allclose(layer(x).reshape(-1, 384), expected, rtol=1e-5, atol=1e-6)


def test_scaled_mm_call_convention_matches_the_emulation():
    """``fp8.scaled_mm`` is the exact call the CUDA path makes (row-major activation, the weight
    transposed to column-major, [M, 1] and [1, N] float32 scales, bf16 out). torch's CPU kernel
    takes the same call, so its layout and scaling are checked here against the emulation
    (both end in bf16: they may differ by a bf16 rounding)."""
    torch.manual_seed(0)
    qa, sa = quantize_rows(torch.randn(48, 64))
    qw, sw = quantize_rows(torch.randn(32, 64))
    try:
        out = fp8.scaled_mm(qa, sa, qw, sw.reshape(1, -1).contiguous())
    except (RuntimeError, NotImplementedError) as err:
        pytest.skip(f"this torch has no CPU _scaled_mm ({err})")
    ref = emulated_mm(qa, sa, qw, sw.reshape(1, -1), torch.float32)
    assert out.dtype == torch.bfloat16 and out.shape == (48, 32)
    assert ((out.float() - ref).abs() <= 2.0**-8 * ref.abs() + 1e-6).all()


def test_to_dtype_leaves_the_fp8_weight_and_scales_alone(linear):
    """``model.to(torch.bfloat16)`` casts every floating buffer (float8 too): the FP8 weight and its
    float32 scales are stored as integers so it cannot; only the bias follows the model's dtype."""
    layer = FP8Linear.from_linear(linear, emulate=True)
    weight, scale = layer.weight_fp8.clone(), layer.weight_scale.clone()
    layer.to(torch.bfloat16)
    assert layer.weight_fp8.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    assert torch.equal(layer.weight_fp8.view(torch.uint8), weight.view(torch.uint8))
    assert torch.equal(layer.weight_scale, scale) and layer.bias.dtype == torch.bfloat16
    with torch.no_grad():
        out = layer(torch.randn(3, 512, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_transposed_input_is_handled():
    torch.manual_seed(0)
    small = nn.Linear(64, 32)
    layer = FP8Linear.from_linear(small, emulate=True)
    x = torch.randn(64, 20).t()  # [20, 64], column-major
    with torch.no_grad():
        assert torch.allclose(layer(x), layer(x.contiguous()))


def test_shapes_that_are_not_multiples_of_16_are_padded_not_changed():
    torch.manual_seed(0)
    small = nn.Linear(40, 24, bias=False)
    layer = FP8Linear.from_linear(small, emulate=True)
    assert layer.weight_fp8.shape == (32, 48) and layer.weight_scale.shape == (1, 32)
    x = torch.randn(5, 40)
    qa, sa = quantize_rows(x)
    qw, sw = quantize_rows(small.weight.detach())
    expected = emulated_mm(qa, sa, qw, sw.reshape(1, -1), torch.float32)  # the unpadded operands
    with torch.no_grad():
        out = layer(x)
    assert out.shape == (5, 24)
    assert torch.allclose(out, expected, rtol=1e-6, atol=1e-7)
    assert layer(torch.zeros(0, 40)).shape == (0, 24)


# -- converting a target -------------------------------------------------------------------------
def names_by_type(model: nn.Module, kind: type) -> set[str]:
    return {name for name, module in model.named_modules() if type(module) is kind}


@pytest.mark.parametrize("tie", [False, True])
def test_exactly_the_decoder_projections_are_replaced(tie):
    target = Target(tiny_qwen3(num_layers=3, tie=tie))
    embed, head = target.embed_tokens.weight, target.lm_head_weight
    replaced = target.use_fp8_linears(emulate=True)
    assert set(replaced) == {f"{i}.{p}" for i in range(3) for p in PROJECTIONS}
    assert names_by_type(target.model, FP8Linear) == {f"model.layers.{n}" for n in replaced}
    assert names_by_type(target.model, nn.Linear) == {"lm_head"}  # the only float linear left
    assert target.embed_tokens.weight is embed and target.lm_head_weight is head
    assert (target.lm_head_weight is target.embed_tokens.weight) == tie
    assert not any("_proj" in name for name, _ in target.model.named_parameters())  # FP8 weights are buffers


def test_routers_stay_in_float():
    """MoE routers pick experts by top-k: a rounding there changes the computation, not a few bits."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = nn.Linear(32, 64)
            self.gate = nn.Linear(32, 8)  # Qwen/Mixtral router
            self.shared_expert_gate = nn.Linear(32, 1)  # Qwen2-MoE
            self.router = nn.Linear(32, 8)

    layers = nn.ModuleList([Block(), Block()])
    assert convert_linears(layers, emulate=True) == ["0.up_proj", "1.up_proj"]
    assert all(type(b.gate) is nn.Linear and type(b.router) is nn.Linear for b in layers)


def test_moe_target_converts_its_attention_only():
    """Qwen3-MoE's experts are fused 3-D weights, not ``nn.Linear``: they stay; its attention converts."""
    from dflash_train.models.tiny import tiny_qwen3_moe

    target = Target(tiny_qwen3_moe(num_layers=2))
    replaced = target.use_fp8_linears(emulate=True)
    assert set(replaced) == {f"{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"}


def test_the_float_weights_are_freed():
    target = Target(tiny_qwen3(num_layers=2))
    weights = [weakref.ref(m.weight) for n, m in target.layers.named_modules() if type(m) is nn.Linear]
    assert len(weights) == 14
    target.use_fp8_linears(emulate=True)
    gc.collect()
    assert all(w() is None for w in weights)
    layer = target.layers[0].mlp.down_proj  # [64, 128]: 1 byte per weight, 4 per row's scale
    assert layer.weight_fp8.nbytes == 64 * 128 and layer.weight_scale.nbytes == 64 * 4


def test_tiny_target_features_stay_close():
    """Six layers of FP8 projections (each within ~0.05 relative RMS, see above): the errors add up
    along the residual stream, yet every feature layer keeps within 0.1 relative RMS of the
    float32 features and a cosine similarity above 0.99 per token."""
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 48))
    layer_ids = [1, 3, 5]
    ref_target = Target(tiny_qwen3(num_layers=6))
    fp8_target = Target(tiny_qwen3(num_layers=6))
    fp8_target.use_fp8_linears(emulate=True)
    ref = ref_target.features(ids, None, layer_ids)
    got = fp8_target.features(ids, None, layer_ids)
    assert got.shape == ref.shape
    for k, layer in enumerate(layer_ids):
        a, b = got[..., k * 64:(k + 1) * 64], ref[..., k * 64:(k + 1) * 64]
        assert rel_rms(a, b) < 0.1, layer
        cos = torch.nn.functional.cosine_similarity(a.reshape(-1, 64), b.reshape(-1, 64), dim=-1)
        assert cos.min() > 0.99, layer


def test_a_device_without_fp8_matmuls_is_refused():
    target = Target(tiny_qwen3(num_layers=1))
    with pytest.raises(ValueError, match="target.fp8_linear: cpu has no FP8 matmuls"):
        target.use_fp8_linears()
    assert names_by_type(target.model, FP8Linear) == set()  # refused before anything changed


@pytest.fixture
def tiny_folder(tmp_path, smollm2_path):
    from transformers import AutoTokenizer

    folder = tmp_path / "target"
    tiny_qwen3(num_layers=2).save_pretrained(folder)
    AutoTokenizer.from_pretrained(smollm2_path).save_pretrained(folder)
    return folder


def test_target_load_applies_the_flag(tiny_folder, monkeypatch):
    with pytest.raises(ValueError, match="cpu has no FP8 matmuls"):
        Target.load(tiny_folder, fp8_linear=True)
    assert names_by_type(Target.load(tiny_folder).model, FP8Linear) == set()
    monkeypatch.setattr(fp8, "why_not_native", lambda device: None)  # as if the CPU had FP8 matmuls
    loaded = Target.load(tiny_folder, fp8_linear=True)
    assert len(names_by_type(loaded.model, FP8Linear)) == 2 * len(PROJECTIONS)


def test_the_trainer_loads_the_target_with_the_flag(tiny_folder):
    from dflash_train.config import config_from_dict
    from dflash_train.train.trainer import Trainer

    cfg = config_from_dict({"target": {"path": str(tiny_folder), "fp8_linear": True}, "train": {"device": "auto"}})
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    with pytest.raises(ValueError, match="target.fp8_linear: cpu has no FP8 matmuls"):
        Trainer(cfg)


# -- the config key ------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["target.fp8_linear=maybe"], "must be true or false"),
    (["target.fp8_linear=true", "target.dtype=float32"], "needs target.dtype auto or bfloat16"),
    (["target.fp8_linear=true", "target.dtype=float16"], "needs target.dtype auto or bfloat16"),
    (["target.fp8_linear=true", "train.device=cpu"], "train.device=cpu has none"),
    (["target.fp8_linear=true", "train.device=cuda", "train.drafter_init=target"], "drafter_init=target"),
    (["target.fp8_linear=true", "train.device=cuda", "train.fsdp_target=true"], "fsdp_target"),
])
def test_config_refuses(overrides, message):
    from dflash_train.config import load_config

    with pytest.raises(ValueError, match=message):
        load_config(None, ["target.path=x", "data.paths=[d.jsonl]", *overrides])


def test_config_accepts_and_defaults_off():
    from dflash_train.config import load_config

    base = ["target.path=x", "data.paths=[d.jsonl]"]
    assert load_config(None, base).target.fp8_linear is False
    for extra in (["train.device=cuda"], ["train.device=auto", "target.dtype=bfloat16"], ["train.device=cuda:1"]):
        assert load_config(None, [*base, "target.fp8_linear=true", *extra]).target.fp8_linear is True


# -- the bench flag ------------------------------------------------------------------------------
def test_bench_flag_is_recorded_and_the_step_runs():
    from dflash_train.bench.job import BenchOptions, bench_job
    from dflash_train.bench.run import run_bench

    opts = BenchOptions(steps=1, warmup=1, profile_steps=0, device="cpu")
    plain = run_bench(bench_job(None, ["train.num_anchors=8"], "tiny"), opts, log=lambda *_: None)
    fp8_run = run_bench(bench_job(None, ["train.num_anchors=8", "target.fp8_linear=true"], "tiny"), opts,
                        log=lambda *_: None)
    assert plain["config"]["target"]["fp8_linear"] is False and plain["config"]["bench"]["target_fp8_linears"] == 0
    assert fp8_run["config"]["target"]["fp8_linear"] is True
    assert fp8_run["config"]["bench"]["target_fp8_linears"] == 8 * 7
    assert math.isfinite(fp8_run["last_loss"]) and fp8_run["last_loss"] != plain["last_loss"]
    # the CPU has no FP8 products to measure: the second ceiling stays null rather than an emulation's speed
    assert fp8_run["matmul_ceiling_fp8_tflops"] is None and fp8_run["mfu_vs_fp8_ceiling"] is None


def test_ceiling_report_divides_by_each_measured_ceiling():
    from dflash_train.bench.run import Ceiling

    both = Ceiling(400.0, 8192, torch.bfloat16, fp8_tflops=1000.0).report(200.0)
    assert both["mfu"] == 0.5 and both["mfu_vs_fp8_ceiling"] == 0.2 and both["matmul_ceiling_fp8_tflops"] == 1000.0
    assert Ceiling(400.0, 8192, torch.bfloat16).report(200.0)["mfu_vs_fp8_ceiling"] is None


def test_bench_cli_flag(capsys):
    import json

    from dflash_train.cli import main

    assert main(["bench", "train.num_anchors=8", "--target-config", "tiny", "--steps", "1", "--warmup", "0",
                 "--profile-steps", "0", "--device", "cpu", "--target-fp8"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["target"]["fp8_linear"] is True
