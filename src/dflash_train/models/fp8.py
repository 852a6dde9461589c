"""FP8 matmuls for the frozen target's linear layers (``target.fp8_linear``).

Why the target, and only the target. The target runs inference only: no gradient flows
through it, and its weights never change. So a weight is quantized ONCE at load time, the
bf16 copy is dropped (half the memory for those weights), and each call quantizes just its
input. The drafter trains: its weights move every step and its backward needs FP8 gradients too,
a different recipe, opt-in separately (``train.fp8_drafter``; the section "training" at the end). The embedding and the lm_head are never touched: the drafter reads them as
tensors (its own lm_head product, the distillation logits), and a vocabulary-wide product
is where quantization error would reach the loss directly.

Why per-ROW scales. e4m3 keeps 3 mantissa bits over a range of +-448: relative precision
is the same for every value in range, but the range is small, so each tensor is first
divided by a scale that maps its largest magnitude to 448. One scale for a whole tensor
lets one outlier (a massive activation in a few channels of a few tokens, common in LLMs)
squeeze every other row into e4m3's subnormals, where the relative error grows.
One scale per output row of the weight (``amax / 448`` over its input dimension) and one
per token of the activation confine an outlier to its own row, and they are exactly what
the rowwise-scaled GEMM applies in its epilogue:

    out[m, n] = (sum_k qa[m, k] * qw[n, k]) * scale_a[m] * scale_w[n]

so no accuracy is paid for the scales themselves.

The error budget. e4m3 has 3 mantissa bits: rounding to nearest moves a value ``m * 2^e``
(``1 <= m < 2``) by at most half a unit in the last place, ``2^-4 * 2^e``: at most 2^-4 of
the value. Uniformly spread in that interval, the error's RMS is ``2^-4 / sqrt(3) * 2^e``, so
the relative RMS error of one element is ``2^-4 / sqrt(3) * sqrt(E[1/m^2]) <= 2^-4 / sqrt(3)
~= 0.036`` (``E[1/m^2] ~= 0.5`` for spread-out data: ~0.026). A product ``qa * qw`` carries
both operands' errors, independent, so a dot product of many terms (no cancellation assumed)
is off by ``sqrt(2)`` times that: at most ``2^-4 * sqrt(2/3) ~= 0.051`` relative RMS, ~0.037
typically (the issue measured 0.0375 on Qwen3-8B-shaped layers). The fp32 accumulation adds
nothing visible. The tests pin those bounds.

Where the product is computed. On a CUDA device with FP8 tensor cores (compute capability
8.9+: Ada, Hopper, Blackwell) ``torch._scaled_mm`` runs it. Elsewhere (the CPU, where the
test suite runs) :func:`emulated_mm` computes the same numbers from the same quantized
operands in float32: e4m3 values are exact in float32, so it differs from the kernel only
by the order of the fp32 accumulation. The CPU tests therefore pin the quantization itself.
The emulation is slower than a plain matmul and only exists for tests: loading a target
with FP8 linears (``convert_linears``) refuses a device without FP8 matmuls unless the
caller asks for the emulation explicitly.

``_scaled_mm``'s rules (torch 2.11-2.14, ``torch/_meta_registrations.py``'s
``_check_scaled_mm_sizes``): both operands 2-D and fp8; the first row-major [M, K], the second
column-major [K, N] (our row-major [N, K] weight, transposed: a view, no copy); K and N
multiples of 16; rowwise scales float32 [M, 1] and [1, N], contiguous; on CUDA the rowwise
kernel returns bfloat16 (fp16/fp32 outputs came later and not on every backend), so the
output is bf16 and cast to the input's dtype when that differs. Layers whose K or N is not a
multiple of 16 are zero-padded once at conversion (zero columns add nothing to a dot product
and change no row's amax; zero output rows are sliced off), so every layer takes the fast path.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
MIN_AMAX = 1e-12  # an all-zero row: a finite scale, every element quantizes to 0
ALIGN = 16  # _scaled_mm wants K and N multiples of 16
# Linear layers inside a decoder layer that stay in bf16: MoE routers (``mlp.gate``, Mixtral's
# ``block_sparse_moe.gate``, Qwen2-MoE's ``shared_expert_gate``). Their FLOPs are negligible and
# their outputs pick experts by top-k, where a rounding error flips a choice, not a few bits.
KEPT_SUFFIXES = ("gate", "router")


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [rows, k] -> (``q`` [rows, k] e4m3, ``scale`` [rows, 1] float32), ``x ~= q * scale``.

    Each row's largest magnitude maps to 448 (e4m3's largest finite value). The clamp matters:
    ``amax / (amax / 448)`` can round to just above 448, and casting an out-of-range value to
    ``float8_e4m3fn`` (which has no infinity) gives NaN rather than saturating.
    """
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=MIN_AMAX)
    scale = amax / E4M3_MAX
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 values ``q * scale`` that a quantized tensor stands for."""
    return q.float() * scale


def scaled_mm(qa: torch.Tensor, scale_a: torch.Tensor, qw: torch.Tensor, scale_w: torch.Tensor) -> torch.Tensor:
    """``qa`` [M, K] e4m3 (row-major), ``qw`` [N, K] e4m3 (row-major weight), ``scale_a`` [M, 1],
    ``scale_w`` [1, N] float32 -> [M, N] bfloat16 through ``torch._scaled_mm``."""
    return torch._scaled_mm(qa, qw.t(), scale_a=scale_a, scale_b=scale_w, out_dtype=torch.bfloat16)


def emulated_mm(qa: torch.Tensor, scale_a: torch.Tensor, qw: torch.Tensor, scale_w: torch.Tensor,
                out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """What :func:`scaled_mm` computes, in float32 on any device: the e4m3 products accumulated
    in fp32, then scaled per row and column (as the kernel's epilogue does), then cast."""
    return ((qa.float() @ qw.float().t()) * scale_a * scale_w).to(out_dtype)


@functools.cache
def _native_on(device_type: str, index: int | None) -> bool:
    """Whether ``torch._scaled_mm`` runs e4m3 on this device: CUDA (not ROCm, whose FP8
    formats differ) with compute capability 8.9 or newer."""
    if device_type != "cuda" or torch.version.hip or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(index) >= (8, 9)


def native_fp8(device: torch.device | str) -> bool:
    device = torch.device(device)
    return _native_on(device.type, device.index)


def why_not_native(device: torch.device | str) -> str | None:
    """None where FP8 matmuls run natively on ``device``; else the reason, for an error message."""
    device = torch.device(device)
    if native_fp8(device):
        return None
    if device.type != "cuda":
        return f"{device.type} has no FP8 matmuls (only an exact but slow emulation, for tests)"
    if torch.version.hip:
        return "ROCm builds are not supported (their FP8 formats differ)"
    return (f"{torch.cuda.get_device_name(device)} (compute capability "
            f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}) has no FP8 tensor cores: 8.9+ "
            "(Ada, Hopper, Blackwell) is needed")


class _CompiledQuantizer:
    """:func:`quantize_rows` compiled on CUDA: eager, its four elementwise passes and a
    reduction each read the activation from memory; compiled, one fused kernel does.
    ``dynamic=True``: one graph for every token count and width. Any compile failure is
    reported once and the eager function is used from then on (an optimization, never a
    requirement)."""

    def __init__(self):
        self.fn = None
        self.failed = False

    def __call__(self, x: torch.Tensor):
        if self.failed or not x.is_cuda:
            return quantize_rows(x)
        if self.fn is None:
            self.fn = torch.compile(quantize_rows, dynamic=True)
        try:
            return self.fn(x)
        except Exception as err:  # noqa: BLE001 - fall back to the eager quantizer
            warnings.warn(f"FP8 activation quantization: torch.compile failed ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); quantizing eagerly", stacklevel=2)
            self.failed = True
            return quantize_rows(x)


_compiled_quantizer = _CompiledQuantizer()


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class FP8Linear(nn.Module):
    """A frozen ``nn.Linear`` with an e4m3 weight (per-output-row scales) and per-token
    activation scales; see the module docstring. Inference only: no parameters, no backward.

    ``weight_fp8`` [N', K'] e4m3 and ``weight_scale`` [1, N'] float32 (N', K': N and K rounded up
    to multiples of 16, zero padded); ``bias`` [N] in the layer's dtype (or None). The first two
    are stored as integer views (``weight_bits`` uint8, ``scale_bits`` int32; viewing back is
    free): ``Module.to(dtype)`` casts every floating buffer, float8 included, so a
    ``model.to(torch.bfloat16)`` would otherwise turn them into bf16 and break ``_scaled_mm``.
    ``emulate``: compute with :func:`emulated_mm` on every device (tests); otherwise
    ``_scaled_mm`` runs where it can and the emulation elsewhere. ``compile_quantizer``: fuse
    the activation quantization with ``torch.compile`` on CUDA.
    """

    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 in_features: int, out_features: int, emulate: bool = False, compile_quantizer: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.emulate, self.compile_quantizer = emulate, compile_quantizer
        self.register_buffer("weight_bits", weight_fp8.view(torch.uint8))
        self.register_buffer("scale_bits", weight_scale.view(torch.int32))
        self.register_buffer("bias", bias)

    @property
    def weight_fp8(self) -> torch.Tensor:
        return self.weight_bits.view(E4M3)

    @property
    def weight_scale(self) -> torch.Tensor:
        return self.scale_bits.view(torch.float32)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, emulate: bool = False, compile_quantizer: bool = True) -> FP8Linear:
        """Quantize ``linear``'s weight (on its device) once; the result holds no reference to it."""
        weight = linear.weight.detach()
        n, k = weight.shape
        weight = F.pad(weight, (0, _padded(k) - k, 0, _padded(n) - n))
        q, scale = quantize_rows(weight)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale.reshape(1, -1).contiguous(), bias, k, n, emulate, compile_quantizer)

    def dequantized_weight(self) -> torch.Tensor:
        """[N, K] float32: the weight this layer multiplies by (for checks and tests)."""
        weight = dequantize_rows(self.weight_fp8, self.weight_scale.reshape(-1, 1))
        return weight[: self.out_features, : self.in_features]

    def _quantize(self, x: torch.Tensor):
        if self.compile_quantizer and x.is_cuda and not torch.compiler.is_compiling():
            return _compiled_quantizer(x)
        return quantize_rows(x)  # inside a compiled layer (target.compile) Inductor fuses it there

    def _native(self, x: torch.Tensor) -> bool:
        if self.emulate:
            return False
        if torch.compiler.is_compiling():  # convert_linears checked the device: traced, no cached lookup
            return x.is_cuda
        return native_fp8(x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        pad = self.weight_fp8.shape[1] - self.in_features
        if pad:
            rows = F.pad(rows, (0, pad))
        qa, scale_a = self._quantize(rows)
        qa, scale_a = qa.contiguous(), scale_a.contiguous()  # no-ops, unless a transposed input kept its strides
        if self._native(x):
            out = scaled_mm(qa, scale_a, self.weight_fp8, self.weight_scale).to(x.dtype)
        else:
            out = emulated_mm(qa, scale_a, self.weight_fp8, self.weight_scale, x.dtype)
        out = out[:, : self.out_features]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, e4m3 rowwise{', emulated' if self.emulate else ''}")


def convertible(name: str, module: nn.Module) -> bool:
    """An ``nn.Linear`` (exactly: not a subclass with its own forward) that is not a router.
    Mixture-of-experts experts held as fused 3-D weights (transformers 5's Qwen3-MoE) are not
    ``nn.Linear`` and stay as they are: in such a target only the attention projections convert."""
    leaf = name.rsplit(".", 1)[-1].lower()
    return type(module) is nn.Linear and not any(leaf.endswith(s) for s in KEPT_SUFFIXES)


@torch.no_grad()
def convert_linears(layers: nn.ModuleList, emulate: bool = False, compile_quantizer: bool = True) -> list[str]:
    """Replace every convertible ``nn.Linear`` inside ``layers`` (the target's decoder layers)
    by an :class:`FP8Linear`, one at a time: each bf16 weight is freed as soon as its FP8 copy
    exists, so the peak is the bf16 model plus one layer's float32 temporaries. Returns the
    replaced names (relative to ``layers``).

    Refuses (``ValueError``) a device without FP8 matmuls unless ``emulate`` (tests): there the
    emulation would be slower than the plain layer and less exact, helping nobody.
    """
    names = [name for name, module in layers.named_modules() if convertible(name, module)]
    if names and not emulate:
        reason = why_not_native(layers.get_submodule(names[0]).weight.device)
        if reason:
            raise ValueError(f"target.fp8_linear: {reason}; set target.fp8_linear=false")
    for name in names:  # no list of the old modules: each one is freed when it is replaced
        parent_name, _, attr = name.rpartition(".")
        parent = layers.get_submodule(parent_name) if parent_name else layers
        setattr(parent, attr, FP8Linear.from_linear(getattr(parent, attr), emulate, compile_quantizer))
    return names


# -- training: the drafter's own linear layers (``train.fp8_drafter``) ---------------------------
#
# The drafter trains, so each of its projections costs three GEMMs per step, and all three run in
# FP8 here (torchao's "rowwise" float8 recipe: e4m3 operands everywhere, one scale per row or
# column along the reduction dimension). For ``y = x W^T`` (x [M, K] tokens, W [N, K]):
#
#     forward      y      = x  @ W^T   reduces over K: x per token (row),   W per output row
#     input grad   dL/dx  = gy @ W     reduces over N: gy per token (row),  W per input COLUMN
#     weight grad  dL/dW  = gy^T @ x   reduces over M: gy per output column, x per input column
#
# Every scale runs along the reduction dimension, the only way it can leave the sum as one factor
# per output row and one per output column (``_scaled_mm``'s rowwise epilogue). So each GEMM is
# ``a @ b^T`` with ``a`` [P, R] and ``b`` [Q, R] both quantized per row over R: :func:`fp8_mm_nt`,
# called on transposed views for the two gradients. The weight is quantized twice (per row for the
# forward, per column for the input gradient) from the master copy at EVERY call: the optimizer
# updates the master (bf16 or float32) and FP8 never outlives a step. The backward quantizes what
# the forward saved in high precision (the input, the weight), as torchao does.
#
# Why e4m3 for the gradient, not e5m2. e5m2's extra exponent bit served tensor-wise scales (one
# scale for a whole gradient whose rows span many octaves); with a scale per row or column the range
# a row must cover is small and e4m3's extra mantissa bit halves the rounding error (2^-4 against
# 2^-3 of each value). The bounds of the forward (module docstring: 2^-4 * sqrt(2/3) relative RMS
# for a product of two quantized operands) then hold for both gradients too, before bf16's output
# rounding (2^-9): the rowwise kernel writes bfloat16, which the emulation reproduces.
#
# Layout (``_scaled_mm``, see above): R and Q multiples of 16. The projections of a real drafter
# are; the token count M (the weight gradient's R) often is not, and is zero padded (zero columns
# add nothing and change no row's amax), as are odd R or Q.

DRAFTER_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _quantize_padded(x: torch.Tensor, cols: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [p, r] zero padded to [rows, cols], quantized per row: a row-major e4m3 tensor (a
    transposed view in gives a contiguous copy out: one byte per element) and [rows, 1] scales."""
    p, r = x.shape
    if cols != r or rows != p:
        x = F.pad(x, (0, cols - r, 0, rows - p))
    q, scale = quantize_rows(x)
    return q.contiguous(), scale


def fp8_mm_nt(a: torch.Tensor, b: torch.Tensor, emulate: bool) -> torch.Tensor:
    """``a`` [P, R] @ ``b`` [Q, R]^T -> [P, Q] bfloat16 (contiguous), both operands quantized to
    e4m3 per row over R; ``_scaled_mm`` unless ``emulate`` (the float32 emulation, autocast off so
    its matmul stays float32). Any strides in (the gradients pass transposed views)."""
    (p, r), q = a.shape, b.shape[0]
    qa, scale_a = _quantize_padded(a, _padded(r), p)
    qb, scale_b = _quantize_padded(b, _padded(r), _padded(q))
    scale_b = scale_b.reshape(1, -1)
    if emulate:
        with torch.autocast(a.device.type, enabled=False):
            out = emulated_mm(qa, scale_a, qb, scale_b)
    else:
        out = scaled_mm(qa, scale_a, qb, scale_b)
    return out if out.shape[1] == q else out[:, :q].contiguous()


# The compiler sees the FP8 GEMMs as two opaque operators (``torch.library.custom_op``) with a
# registered backward, never their insides. Traced by torch 2.11's Inductor on CUDA, the same code
# as a ``torch.autograd.Function`` ran a correct forward and returned all-zero gradients for every
# weight of a compiled drafter layer (H200, seen by tests/gpu/test_gpu_fp8.py; not on the CPU, not
# eager). As operators, each GEMM (quantize both operands, ``_scaled_mm``) runs exactly as it does
# eagerly, inside the compiled layer and inside a captured CUDA graph alike.
@torch.library.custom_op("dflash_train::fp8_mm_nt", mutates_args=())
def _fp8_mm_nt_op(a: torch.Tensor, b: torch.Tensor, emulate: bool) -> torch.Tensor:
    return fp8_mm_nt(a, b, emulate)


@_fp8_mm_nt_op.register_fake
def _(a: torch.Tensor, b: torch.Tensor, emulate: bool) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16)


@torch.library.custom_op("dflash_train::fp8_linear_nt", mutates_args=())
def _fp8_linear_op(x: torch.Tensor, weight: torch.Tensor, emulate: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """``x`` [M, K] @ ``weight`` [N, K]^T in FP8 -> [M, N] ``out_dtype``: the forward GEMM, whose
    registered backward (below) runs the two gradient GEMMs in FP8 as well. The cast is inside, so
    the backward receives the gradient in ``out_dtype`` (not rounded to bf16 first)."""
    return fp8_mm_nt(x, weight, emulate).to(out_dtype)


@_fp8_linear_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, emulate: bool, out_dtype: torch.dtype) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=out_dtype)


def _fp8_linear_setup(ctx, inputs, output) -> None:
    """Saves ``x`` and ``weight`` in their own precision (the backward quantizes them again, along
    the other dimension, as torchao does)."""
    x, weight, emulate, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.emulate = emulate


def _fp8_linear_backward(ctx, grad_out: torch.Tensor):
    """The gradients in their inputs' dtypes (float32 for float32 master weights: the bf16 GEMM
    output, widened)."""
    x, weight = ctx.saved_tensors
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:  # gy [M, N] @ W [N, K]: b = W^T [K, N], per column of W
        grad_x = _fp8_mm_nt_op(grad_out, weight.t(), ctx.emulate).to(x.dtype)
    if ctx.needs_input_grad[1]:  # gy^T [N, M] @ x [M, K]: b = x^T [K, M], per input channel
        grad_w = _fp8_mm_nt_op(grad_out.t(), x.t(), ctx.emulate).to(weight.dtype)
    return grad_x, grad_w, None, None


_fp8_linear_op.register_autograd(_fp8_linear_backward, setup_context=_fp8_linear_setup)


def fp8_training_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        emulate: bool = False) -> torch.Tensor:
    """``F.linear`` with its forward and backward GEMMs in FP8, and ``F.linear``'s autocast
    behaviour: under autocast the input is cast to the autocast dtype (what the float run's
    ``F.linear`` multiplies, and half the memory saved for the backward) and so is the output;
    the weight is quantized from its master copy directly (no bf16 copy in between)."""
    device_type = x.device.type
    out_dtype = x.dtype
    if torch.is_autocast_enabled(device_type):
        out_dtype = torch.get_autocast_dtype(device_type)
        x = x.to(out_dtype)
    rows = x.reshape(-1, x.shape[-1])
    out = _fp8_linear_op(rows, weight, emulate, out_dtype)
    if bias is not None:
        out = out + bias.to(out_dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


class FP8TrainingLinear(nn.Linear):
    """An ``nn.Linear`` of the drafter whose GEMMs (forward and backward) run in FP8 e4m3 with
    rowwise scales. Its parameters are the float layer's own ``weight`` and ``bias`` (same objects,
    same names): the optimizer, checkpoints, export and DDP see an unchanged drafter. ``emulate``:
    the float32 emulation (CPU tests) instead of ``_scaled_mm``, fixed at construction so a
    compiled graph never asks the device at run time."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 emulate: bool = False):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.emulate = emulate

    @classmethod
    def from_linear(cls, linear: nn.Linear, emulate: bool = False) -> FP8TrainingLinear:
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta", emulate=emulate)
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_training_linear(x, self.weight, self.bias, self.emulate)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8 e4m3 rowwise forward and backward{', emulated' if self.emulate else ''}"


def drafter_projection_names(drafter: nn.Module) -> list[str]:
    """The drafter's attention and MLP projections (plain ``nn.Linear`` inside ``drafter.layers``).

    Left in float, on purpose: ``fc`` (reads the target's raw residual stream, whose massive
    activations in a few channels would push each token's other channels into e4m3's subnormals:
    a per-token scale cannot help within a token), DFlash2's ``kernel_projection`` (its output sets
    each token's convolution taps multiplicatively, its width 2 * K * groups is small and need not
    be a multiple of 16, and it starts at zero) and the selector's ``hidden_projection`` (rank-r
    scores ranked by top-k, where a rounding flips a choice, as for MoE routers); the embedding and
    lm_head are the target's, never the drafter's.
    """
    layers = drafter.layers
    return [f"layers.{name}" for name, module in layers.named_modules()
            if type(module) is nn.Linear and name.split(".", 1)[-1] in DRAFTER_PROJECTIONS]


def use_fp8_training_linears(drafter: nn.Module, emulate: bool = False) -> list[str]:
    """Swap the drafter's projections (:func:`drafter_projection_names`) for
    :class:`FP8TrainingLinear` holding the same parameters; returns the swapped names. Call it
    before checkpoint wrapping, compilation, DDP and the optimizer (``parallelize_drafter``).

    Refuses (``ValueError``) a device without FP8 matmuls unless ``emulate`` (tests): there the
    emulation is slower than the float layer and helps nobody. On a device without them the
    emulation is used even if ``why_not_native`` was bypassed, so a test can drive the trainer.
    """
    names = drafter_projection_names(drafter)
    if not names:
        return names
    device = drafter.get_submodule(names[0]).weight.device
    if not emulate:
        reason = why_not_native(device)
        if reason:
            raise ValueError(f"train.fp8_drafter: {reason}; set train.fp8_drafter=false")
    emulate = emulate or not native_fp8(device)
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = drafter.get_submodule(parent_name)
        setattr(parent, attr, FP8TrainingLinear.from_linear(getattr(parent, attr), emulate))
    return names
