"""FP8 GEMMs in the drafter's own training (``models/fp8.py``'s training section, ``train.fp8_drafter``), on the CPU.

The CPU has no FP8 matmuls, so the layers run the float32 emulation: the same e4m3 operands,
the same per-row / per-column scales and the same bfloat16 output as ``torch._scaled_mm``.
``tests/gpu/test_gpu_fp8.py`` checks the kernel against it.

Bounds. Quantizing to e4m3 (3 mantissa bits) moves a normal value ``v`` by at most ``U * |v|``,
``U = 2^-4``, and a value in e4m3's subnormal range (below ``2^-6`` of 448 times the row's scale) by
at most half the subnormal spacing, ``scale * 2^-10``. Call that per-element bound ``e(v)``. A GEMM
``sum_r a[p, r] * b[q, r]`` of two quantized operands is then off by at most

    sum_r e(a) |b| + |a| e(b) + e(a) e(b)                     (worst case, every element)

before the output is rounded to bfloat16 (half a unit in its 8th bit: ``2^-9`` of the value), and
float32's accumulation adds ~``2^-24 * R`` of ``sum |a b|``, far below the rest. Independent
roundings spread uniformly over ``+-U|v|`` give a relative RMS of ``U / sqrt(3)`` per operand, so
``U * sqrt(2/3) ~= 0.051`` for a product of two (module docstring of ``models/fp8.py``). Each of
the three GEMMs (forward, input gradient, weight gradient) multiplies two quantized operands,
so both bounds apply to all three. (e5m2, one mantissa bit less, would double ``U`` to ``2^-3``:
the gradients here are e4m3, as torchao's rowwise recipe has them.)
"""

from __future__ import annotations

import math

import pytest
import torch
from testkit import fp8_drafter_grads, tiny_chat_job, tiny_chat_target, tiny_drafter, tiny_qwen3
from torch import nn

from dflash_train.models import fp8
from dflash_train.models.fp8 import (
    DRAFTER_PROJECTIONS,
    FP8TrainingLinear,
    dequantize_rows,
    fp8_mm_nt,
    fp8_training_linear,
    quantize_rows,
    use_fp8_training_linears,
)
from dflash_train.models.target import Target

U = 2.0**-4  # e4m3's unit roundoff
LINEAR_RMS_BOUND = U * math.sqrt(2 / 3)  # ~0.051
BF16_HALF_ULP = 2.0**-9  # the kernel's bfloat16 output rounding, relative


def rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).norm() / ref.double().norm()).item()


def element_error(v: torch.Tensor) -> torch.Tensor:
    """``e(v)``: the largest move quantizing ``v`` per row can make to each element (float64)."""
    _, scale = quantize_rows(v)
    return torch.maximum(U * v.double().abs(), scale.double() * 2.0**-10)


def gemm_bound(a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The worst-case error of ``fp8_mm_nt(a, b)`` against the exact ``a @ b^T`` (the docstring's sum),
    plus bf16's output rounding and a little float32 slack."""
    ea, eb = element_error(a), element_error(b)
    aa, ab = a.double().abs(), b.double().abs()
    quantization = ea @ ab.t() + aa @ eb.t() + ea @ eb.t()
    return quantization + BF16_HALF_ULP * (ref.abs() + quantization) + 1e-6 * (aa @ ab.t())


def operands(m: int = 300, k: int = 256, n: int = 192, seed: int = 0):
    """Tokens of many magnitudes (rowwise scales must handle them), a weight, an output gradient."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]
    w = torch.randn(n, k, generator=g) * 0.05
    gy = torch.randn(m, n, generator=g) * torch.logspace(-3, 1, n)[None, :]
    return x, w, gy


def fp8_and_exact(x, w, gy):
    """(y, dL/dx, dL/dW) of the FP8 layer (emulated, float32) and of the float64 product."""
    xf, wf = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fp8_training_linear(xf, wf, emulate=True)
    y.backward(gy)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    ref = xd @ wd.t()
    ref.backward(gy.double())
    return (y, xf.grad, wf.grad), (ref.detach(), xd.grad, wd.grad)


# -- the three GEMMs -------------------------------------------------------------------------------
def test_forward_and_both_gradients_within_the_derived_bounds():
    """M = 300 tokens (not a multiple of 16: the weight gradient pads its reduction), every element
    within the worst-case bound, each output within the RMS bound, and visibly quantized."""
    x, w, gy = operands()
    got, exact = fp8_and_exact(x, w, gy)
    # each GEMM as a @ b^T: forward (x, W), input gradient (gy, W^T), weight gradient (gy^T, x^T)
    pairs = [(x, w), (gy, w.t()), (gy.t(), x.t())]
    for name, out, ref, (a, b) in zip(("y", "grad_x", "grad_w"), got, exact, pairs):
        assert out.dtype == torch.float32 and out.shape == ref.shape, name
        err = (out.double() - ref).abs()
        bound = gemm_bound(a, b, ref)
        assert (err <= bound).all(), (name, (err / bound).max().item())
        assert 0.01 < rel_rms(out, ref) < LINEAR_RMS_BOUND + BF16_HALF_ULP, (name, rel_rms(out, ref))


def test_each_gemm_is_the_product_of_its_quantized_operands():
    """Gradcheck-style consistency: the backward is exactly the derivative of a linear layer, taken at
    the quantized operands, each GEMM scaled along its own reduction dimension (per token and per
    output row forward; per token and per input column of W for dL/dx; per output and per input
    channel over the tokens for dL/dW). Scaling along the wrong axis, a transposition or a missed
    padding would each break the equality."""
    x, w, gy = operands(m=45, k=64, n=48, seed=1)
    got, _ = fp8_and_exact(x, w, gy)

    def dq(t):  # per row over the last dimension, which is each GEMM's reduction dimension
        return dequantize_rows(*quantize_rows(t))

    expected = [dq(x) @ dq(w).t(), dq(gy) @ dq(w.t()).t(), dq(gy.t()) @ dq(x.t()).t()]
    for out, exp in zip(got, expected):
        torch.testing.assert_close(out, exp.to(torch.bfloat16).float(), rtol=2.0**-8, atol=1e-6)


def test_gradient_agrees_with_finite_differences_of_the_exact_layer():
    """The quantized forward is a step function (finite differences of it are zero or huge), so the FP8
    backward is checked against what it stands for: the directional derivative of the exact layer.
    <u, dy> for a step along v equals <dL/dx, v> + <dL/dW, V> up to the gradient bounds above."""
    x, w, gy = operands(m=64, k=128, n=96, seed=2)
    g = torch.Generator().manual_seed(3)
    v, vw = torch.randn(x.shape, generator=g).double(), torch.randn(w.shape, generator=g).double()
    got, _ = fp8_and_exact(x, w, gy)
    eps = 1e-4
    xd, wd, u = x.double(), w.double(), gy.double()
    numeric = ((u * ((xd + eps * v) @ (wd + eps * vw).t())).sum() - (u * ((xd - eps * v) @ (wd - eps * vw).t())).sum())
    numeric = numeric / (2 * eps)
    analytic = (got[1].double() * v).sum() + (got[2].double() * vw).sum()
    scale = (got[1].double().norm() * v.norm() + got[2].double().norm() * vw.norm())
    assert abs(analytic - numeric) <= LINEAR_RMS_BOUND * scale, (analytic.item(), numeric.item())


def test_fp8_mm_nt_pads_odd_shapes_and_takes_transposed_views():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(5, 40, generator=g), torch.randn(24, 40, generator=g)
    out = fp8_mm_nt(a, b, emulate=True)
    assert out.shape == (5, 24) and out.dtype == torch.bfloat16
    qa, sa = quantize_rows(a)
    qb, sb = quantize_rows(b)
    torch.testing.assert_close(out.float(), (dequantize_rows(qa, sa) @ dequantize_rows(qb, sb).t()).to(torch.bfloat16)
                               .float(), rtol=0, atol=0)
    transposed = fp8_mm_nt(a.t().contiguous().t(), b.t().contiguous().t(), emulate=True)  # same values, other strides
    assert torch.equal(transposed, out)
    assert fp8_mm_nt(torch.zeros(0, 40), b, emulate=True).shape == (0, 24)


# -- the layer -------------------------------------------------------------------------------------
def test_layer_shapes_bias_and_inputs_without_grad():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=True)
    layer = FP8TrainingLinear.from_linear(linear, emulate=True)
    assert layer.weight is linear.weight and layer.bias is linear.bias  # the same parameters
    x = torch.randn(2, 7, 64)
    y = layer(x)
    assert y.shape == (2, 7, 48)
    assert rel_rms(y, linear(x)) < LINEAR_RMS_BOUND
    y.square().sum().backward()  # x needs no gradient: only dL/dW and dL/db are computed
    ref_w, ref_b = torch.autograd.grad(linear(x).square().sum(), [linear.weight, linear.bias])
    assert rel_rms(layer.weight.grad, ref_w) < 2 * LINEAR_RMS_BOUND  # dL/dy is itself an FP8 product here
    assert rel_rms(layer.bias.grad, ref_b) < LINEAR_RMS_BOUND


def test_autocast_gives_the_float_layers_dtypes():
    """Under bf16 autocast ``F.linear`` returns bf16 and the gradients keep their leaves' dtypes
    (float32 input, float32 master weight); the FP8 layer does the same, and its emulated product
    stays in float32 (autocast would otherwise run the emulation's matmul in bf16)."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 32, bias=True)
    layer = FP8TrainingLinear.from_linear(linear, emulate=True)
    x = torch.randn(10, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        ref = linear(x)
    assert y.dtype == ref.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    assert rel_rms(y, ref) < LINEAR_RMS_BOUND + 2 * BF16_HALF_ULP


def test_master_weights_move_and_are_requantized_each_step():
    """The optimizer updates the float master; the next call quantizes the new values (no FP8 copy kept)."""
    torch.manual_seed(0)
    layer = FP8TrainingLinear.from_linear(nn.Linear(32, 32, bias=False), emulate=True)
    assert list(layer.buffers()) == []  # no FP8 copy of the weight lives between calls
    x = torch.randn(16, 32)
    before = layer(x).detach()
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(x).square().sum().backward()
    opt.step()
    assert layer.weight.dtype == torch.float32
    after = layer(x).detach()
    torch.testing.assert_close(after, fp8_training_linear(x, layer.weight.detach().clone(), emulate=True))
    assert rel_rms(after, before) > 0.1


# -- the module swap -------------------------------------------------------------------------------
def names_of(model: nn.Module, kind: type) -> set[str]:
    return {name for name, module in model.named_modules() if type(module) is kind}


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_swap_replaces_exactly_the_projections_and_keeps_the_state_dict(kind):
    target = Target(tiny_qwen3(num_layers=6))
    extra = {"kind": "dflash2"} if kind == "dflash2" else {}
    drafter, _ = tiny_drafter(target, num_layers=2, **extra)
    before = {k: (v.shape, v.dtype, v.data_ptr()) for k, v in drafter.state_dict().items()}
    params = dict(drafter.named_parameters())
    swapped = use_fp8_training_linears(drafter, emulate=True)
    expected = {f"layers.{i}.{p}" for i in range(2) for p in DRAFTER_PROJECTIONS}
    assert set(swapped) == expected and names_of(drafter, FP8TrainingLinear) == expected
    kept = {"fc"} | ({f"layers.{i}.{c}.kernel_projection" for i in range(2) for c in ("attention_conv", "mlp_conv")}
                     | {"candidate_selector.hidden_projection"} if kind == "dflash2" else set())
    assert names_of(drafter, nn.Linear) == kept
    after = {k: (v.shape, v.dtype, v.data_ptr()) for k, v in drafter.state_dict().items()}
    assert after == before  # same keys, shapes, dtypes, storage: checkpoints and export see no change
    assert all(p is params[n] for n, p in drafter.named_parameters())  # the optimizer's parameters
    plain, _ = tiny_drafter(target, num_layers=2, seed=1, **extra)
    plain.load_state_dict(drafter.state_dict())  # strict: a float drafter takes the checkpoint as is


def test_swap_refuses_a_device_without_fp8_matmuls():
    drafter, _ = tiny_drafter(Target(tiny_qwen3(num_layers=6)))
    with pytest.raises(ValueError, match="train.fp8_drafter: cpu has no FP8 matmuls"):
        use_fp8_training_linears(drafter)
    assert names_of(drafter, FP8TrainingLinear) == set()  # refused before anything changed


def test_swapped_drafter_forward_and_backward_stay_close():
    """The whole tiny drafter (2 layers, 14 FP8 projections): outputs and every gradient near the
    float ones. Errors add up over the layers and the backward chain, so the bound is a few times a
    single layer's."""
    target = Target(tiny_qwen3(num_layers=6))
    ref, cfg = tiny_drafter(target, num_layers=2)
    low, _ = tiny_drafter(target, num_layers=2)
    use_fp8_training_linears(low, emulate=True)
    g = torch.Generator().manual_seed(0)
    embeds, feats = torch.randn(2, 8, 64, generator=g), torch.randn(2, 12, 64 * len(cfg.target_layer_ids), generator=g)
    qpos, cpos = torch.arange(12, 20).expand(2, 8), torch.arange(12).expand(2, 12)
    outs = {}
    for name, model in (("ref", ref), ("fp8", low)):
        out = model(embeds, feats, qpos, cpos)
        out.square().mean().backward()
        outs[name] = (out.detach(), {n: p.grad for n, p in model.named_parameters()})
    assert rel_rms(outs["fp8"][0], outs["ref"][0]) < 2 * LINEAR_RMS_BOUND
    for n, grad in outs["ref"][1].items():
        assert rel_rms(outs["fp8"][1][n], grad) < 4 * LINEAR_RMS_BOUND, n


def test_compiled_drafter_layers_keep_the_eager_fp8_gradients():
    """The drafter layers compiled (as the trainer does on a GPU) around the FP8 operators: the same
    output and gradients as eager, up to the rounding of the compiled bf16 code around them (which
    moves a few e4m3 roundings: ~0.05 seen, bound 4x a single layer's). An FP8 product traced into
    Inductor once returned all-zero weight gradients on an H200 (relative error 1.0 here); the GPU
    twin of this test, in tests/gpu/test_gpu_fp8.py, is the one that saw it."""
    eager_out, eager = fp8_drafter_grads("cpu", fp8=True, compile=False)
    out, compiled = fp8_drafter_grads("cpu", fp8=True, compile=True)
    assert rel_rms(out, eager_out) < 2 * LINEAR_RMS_BOUND
    for name, grad in eager.items():
        assert rel_rms(compiled[name], grad) < 4 * LINEAR_RMS_BOUND, name


def test_parallelize_drafter_swaps_before_checkpointing():
    """The one application point: the swap comes first, so the checkpoint wrapper recomputes FP8
    layers in the backward, giving exactly the gradients of the unwrapped FP8 drafter."""
    from dflash_train.train.parallelize import parallelize_drafter

    target = Target(tiny_qwen3(num_layers=6))
    grads = {}
    for wrapped in (False, True):
        drafter, cfg = tiny_drafter(target, num_layers=2)
        model = parallelize_drafter(drafter, wrapped, False, fp8=True, fp8_emulate=True)
        assert len(names_of(drafter, FP8TrainingLinear)) == 2 * len(DRAFTER_PROJECTIONS)
        g = torch.Generator().manual_seed(0)
        embeds, feats = torch.randn(1, 8, 64, generator=g), torch.randn(1, 12, 64 * len(cfg.target_layer_ids), generator=g)
        model(embeds, feats, torch.arange(12, 20)[None], torch.arange(12)[None]).square().mean().backward()
        grads[wrapped] = {n.replace("._checkpoint_wrapped_module", ""): p.grad for n, p in drafter.named_parameters()}
    assert grads[True].keys() == grads[False].keys()
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, rtol=0, atol=0, msg=name)


# -- training --------------------------------------------------------------------------------------
@pytest.fixture
def fp8_on_this_cpu(monkeypatch):
    """As if the CPU had FP8 matmuls: the trainer's real application point swaps the layers, which
    then run the emulation (``use_fp8_training_linears`` falls back to it where none exist)."""
    monkeypatch.setattr(fp8, "why_not_native", lambda device: None)


def test_training_with_fp8_projections_tracks_the_float_run(tmp_path, smollm2_path, fp8_on_this_cpu):
    """16 steps of the tiny chat job through the trainer (``train.fp8_drafter``, applied in
    ``parallelize_drafter``): the loss falls as the float run's does and stays within a few percent
    of it at every step; the checkpoint holds the float drafter's keys."""
    import json

    from dflash_train.config import config_from_dict
    from dflash_train.train.loop import train

    curves, trainers = {}, {}
    for name, on in (("float", False), ("fp8", True)):
        job = tiny_chat_job(tmp_path / name, max_steps=16, device="auto", fp8_drafter=on, save_every_steps=16)
        cfg = config_from_dict(job)
        cfg.validate()
        train(cfg, target=tiny_chat_target(smollm2_path), echo=lambda *a: None)
        rows = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [r["loss"] for r in rows if "loss" in r]
        trainers[name] = sorted(p.name for p in (tmp_path / name / "run").iterdir())
    ref, got = curves["float"], curves["fp8"]
    assert len(got) == 16
    assert sum(got[-4:]) < 0.8 * sum(got[:4]), got
    assert got != ref  # the FP8 layers really ran
    for a, b in zip(got, ref):
        assert abs(a - b) <= 0.05 * b, (got, ref)
    assert trainers["fp8"] == trainers["float"]


def test_the_trainer_swaps_the_drafter_layers(tmp_path, smollm2_path, fp8_on_this_cpu):
    from dflash_train.config import config_from_dict
    from dflash_train.train.trainer import Trainer

    job = tiny_chat_job(tmp_path, max_steps=1, device="auto", fp8_drafter=True)
    trainer = Trainer(config_from_dict(job), target=tiny_chat_target(smollm2_path), echo=lambda *a: None)
    assert len(names_of(trainer.drafter, FP8TrainingLinear)) == len(DRAFTER_PROJECTIONS)  # 1 layer
    assert all(m.emulate for m in trainer.drafter.modules() if isinstance(m, FP8TrainingLinear))
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert {id(p) for p in trainer.drafter.parameters()} == optimized


def test_the_trainer_refuses_a_cpu_without_the_bypass(tmp_path, smollm2_path):
    from dflash_train.config import config_from_dict
    from dflash_train.train.trainer import Trainer

    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    job = tiny_chat_job(tmp_path, max_steps=1, device="auto", fp8_drafter=True)
    with pytest.raises(ValueError, match="train.fp8_drafter: cpu has no FP8 matmuls"):
        Trainer(config_from_dict(job), target=tiny_chat_target(smollm2_path), echo=lambda *a: None)


# -- the config key --------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["train.fp8_drafter=maybe"], "must be true or false"),
    (["train.fp8_drafter=true", "train.device=cpu"], "train.device=cpu has none"),
    (["train.fp8_drafter=true", "train.device=cuda", "train.fsdp_drafter=true"], "fsdp_drafter"),
])
def test_config_refuses(overrides, message):
    from dflash_train.config import load_config

    with pytest.raises(ValueError, match=message):
        load_config(None, ["target.path=x", "data.paths=[d.jsonl]", *overrides])


def test_config_accepts_and_defaults_off():
    from dflash_train.config import load_config

    base = ["target.path=x", "data.paths=[d.jsonl]"]
    assert load_config(None, base).train.fp8_drafter is False
    for extra in (["train.device=cuda"], ["train.device=auto"], ["train.device=cuda:1", "target.fp8_linear=true"]):
        assert load_config(None, [*base, "train.fp8_drafter=true", *extra]).train.fp8_drafter is True


# -- the bench flag --------------------------------------------------------------------------------
def test_bench_drafter_fp8_flag(capsys):
    import json

    from dflash_train.cli import main

    args = ["bench", "train.num_anchors=8", "--target-config", "tiny", "--drafter-layers", "2", "--steps", "1",
            "--warmup", "1", "--profile-steps", "0", "--device", "cpu"]
    assert main([*args, "--drafter-fp8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["train"]["fp8_drafter"] is True and result["config"]["bench"]["drafter_fp8_linears"] == 2 * 7
    assert math.isfinite(result["last_loss"])
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["config"]["train"]["fp8_drafter"] is False and plain["config"]["bench"]["drafter_fp8_linears"] == 0
    assert plain["last_loss"] != result["last_loss"]
