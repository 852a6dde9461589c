"""Greedy evaluation decoding with static shapes: preallocated caches and CUDA graphs.

Why: with a small target, the reference loop in :mod:`.speculative` spends its time in
Python, not on the GPU. Each Hugging Face forward of SmolLM2-135M (30 layers) costs
~30 ms of host work on an H200 (measured: 33 tokens/s for plain decoding), so both the
speedup and the evaluation's wall time measure launch overhead. Here every per-token
step has a fixed shape, so on CUDA it is captured once as a CUDA graph and replayed:

* target: K/V in :class:`~.cache.KVBuffers` of a fixed length ``L``;
  a step writes ``q`` new positions (1 for plain decoding, ``B`` for verification) and
  masks keys after each query's position, so stale entries (rejected drafts) are never
  seen and are overwritten by the next step. No crop is needed;
* drafter: its context K/V live in a slotted :class:`~.cache.DrafterContextCache` (``L`` slots + one
  scratch slot). Each step brings up to ``B`` new context features (the verified ones);
  the unused rows of the fixed-size input are written to the scratch slot, which no
  query can see;
* one host sync per verify step: the drafts and the target's argmax come back together
  (``B`` + ``B`` integers) to decide acceptance (:mod:`.core`'s longest matching prefix). The
  loop itself is the reference loop's: :func:`~.core.speculative_loop` and
  :func:`~.core.plain_loop` run this engine's steps (:class:`_SpecSteps`, :class:`_PlainSteps`),
  so the stop, budget, commit and timing rules are written once. The drafts come from the drafter's chooser inside the
  graphed draft step (:func:`~.core.block_chooser`: each slot's argmax for DFlash). The
  draft/verify time split comes from CUDA events, not from extra syncs: it is GPU time
  from the draft's inputs to the verify launch, and of the verify step itself.

Fewer GPU kernels per step (the steps are launch-bound for a small target):

* the verify step returns the target's argmax next to the drafts, so the host syncs on
  one ready tensor (no argmax/cat kernels outside the graph); the plain step likewise;
* the target's features come from forward hooks registered once per layer and never
  removed (:class:`_FeatureTap` says why), so ``torch.compile`` can trace the step;
* grouped-query attention without ``repeat_kv`` copies of the cache (:mod:`.grouped`);
* optionally (``fuse_projections``) one GEMM for q/k/v and one for gate/up per target
  layer (:mod:`.fused`): 4 matrix products per layer instead of 7;
* ``compile=True`` (or an inductor mode name) runs each step through ``torch.compile``
  (static shapes) before capture: inductor fuses the norms, RoPE and masks. A failure
  to compile warns and keeps the uncompiled step.

Prompts (variable length) run eagerly through the same functions. Greedy only: the
sampling path keeps the reference loop. Any capture failure falls back to eager with a
warning. In float32 the tokens equal :func:`~.speculative.target_generate`'s and the
acceptance lengths equal :func:`~.speculative.speculative_generate`'s (tests).
"""

from __future__ import annotations

import contextlib
import time
import warnings
import weakref

import torch

from dflash_train.devices import synchronize
from dflash_train.hf_compat import cache_kwarg
from dflash_train.models.attention import decode_masks

from .cache import DrafterContextCache, KVBuffers, capture_cuda_graph
from .core import (
    GREEDY,
    GenResult,
    SpecResult,
    block_chooser,
    compile_step,
    leading_matches,
    plain_loop,
    speculative_loop,
)
from .experts import CAPTURE_SAFE, experts_as, needs_capture_safe_experts
from .fused import FusedProjections
from .grouped import grouped_sdpa
from .proposers import block_hidden, block_logits, drafter_setting
from .skinny import check_linear_mode, skinny_linear

MODES = ("auto", "eager", "cudagraph")
STEPS = ("plain", "verify", "draft")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")  # ours capture the graph: no inductor cudagraphs


class _LayerTap:
    """The last output of one target layer, stored by a forward hook only while ``armed``."""

    def __init__(self, layer):
        self.armed, self.out = False, None
        layer.register_forward_hook(self._store)

    def _store(self, _module, _args, output):
        if self.armed:
            self.out = output[0] if isinstance(output, tuple) else output


_LAYER_TAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> its _LayerTap


def _layer_tap(layer) -> _LayerTap:
    """``layer``'s tap, made (and its hook registered) the first time any decoder asks."""
    if layer not in _LAYER_TAPS:
        _LAYER_TAPS[layer] = _LayerTap(layer)
    return _LAYER_TAPS[layer]


class _FeatureTap:
    """The raw outputs of the feature layers at every target forward inside :meth:`armed`
    (the same tensors as ``Target.forward_with_features``, whose per-call hooks would stop
    ``torch.compile`` tracing the step).

    Each layer gets one hook, shared by every decoder on that target and never removed.
    Removing hooks is what broke compiled steps: a decoder held in a reference cycle is
    collected at an arbitrary allocation, and a hook removed then, in the middle of another
    decoder's trace or guard building, made dynamo fail (``IndexError`` while creating a
    guard; a traced ``torch.cat`` reading the prompt's stale 5-row output). Disarmed, the
    hooks store nothing, so training forwards on the same target keep no extra tensors."""

    def __init__(self, layers, layer_ids: list[int]):
        self.layer_ids = layer_ids
        self.taps = {i: _layer_tap(layers[i]) for i in sorted(set(layer_ids))}

    @contextlib.contextmanager
    def armed(self):
        for tap in self.taps.values():
            tap.armed = True
        try:
            yield
        finally:
            for tap in self.taps.values():
                tap.armed, tap.out = False, None

    def features(self) -> torch.Tensor:
        """The feature layers' last outputs, concatenated in ``layer_ids`` order."""
        return torch.cat([self.taps[i].out for i in self.layer_ids], dim=-1)


class _Graphed:
    """``fn()`` (reading and writing only fixed tensors) run eagerly or as a CUDA graph,
    optionally compiled first. Failures degrade one level at a time with a warning:
    compiled graph -> uncompiled graph -> eager. ``fn`` must be idempotent (a warm-up run
    before capture writes the same K/V again)."""

    def __init__(self, fn, use_graph: bool, compile_mode: str | None = None):
        self.eager_fn, self.use_graph = fn, use_graph
        self.fn = compile_step(fn, compile_mode) if compile_mode else fn  # three steps, one shape each
        self.compiled, self.warm = compile_mode is not None, False
        self.graph, self.outputs = None, None

    def _uncompile(self, err: Exception, what: str) -> None:
        warnings.warn(f"static eval: compiled step failed at {what} ({type(err).__name__}: {err}); "
                      "using the uncompiled step", stacklevel=3)
        self.fn, self.compiled, self.graph = self.eager_fn, False, None

    def __call__(self):
        if self.compiled and not self.warm:  # compile (and autotune) outside any capture
            try:
                out = self.fn()
                self.warm = True
                if not self.use_graph:
                    return out
            except Exception as err:  # noqa: BLE001 - any compile failure: keep the plain step
                self._uncompile(err, "compile")
        if not self.use_graph:
            return self.fn()
        try:
            if self.graph is None:
                self.graph, self.outputs = capture_cuda_graph(self.fn)
            self.graph.replay()
            return self.outputs
        except Exception as err:  # noqa: BLE001 - any capture failure: one level down
            torch.cuda.synchronize()
            if self.compiled:
                self._uncompile(err, "capture")
                return self()
            warnings.warn(f"static eval: CUDA graph failed ({type(err).__name__}: {err}); running eagerly",
                          stacklevel=2)
            self.use_graph, self.graph = False, None
            return self.fn()


class _Clock:
    """Marks on the device's timeline for the draft/verify split: CUDA events on a GPU (no
    extra host sync: read after the step's own sync), ``perf_counter`` on a CPU; totals
    (:meth:`wall`) after a device sync (:class:`~.core.StepClock`)."""

    def __init__(self, device):
        self.device, self.cuda = device, device.type == "cuda"

    def wall(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def now(self):
        return self.mark()

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


class StaticDecoder:
    """Greedy plain and DFlash speculative decoding of one prompt at a time, static shapes.

    ``max_len`` bounds prompt + new tokens + one block; buffers and graphs are built once
    and reused for every prompt. ``mode``: eager or CUDA graphs (auto: graphs on CUDA);
    ``compile``: torch.compile each step first (True or an inductor mode in
    :data:`COMPILE_MODES`), only the steps named in ``compile_steps`` (``("draft",)``
    compiles the drafter's step alone: the target's plain and verify steps then run the
    same uncompiled kernels, so a speedup compares equal target engines);
    ``grouped_attention``: grouped-query attention without K/V copies;
    ``fuse_projections``: one GEMM per q/k/v and gate/up group; ``linear``: how few-row
    float32 matmuls run (:mod:`.skinny`). All of these change float rounding only, never
    the algorithm: tokens equal plain greedy in float32 (tests)."""

    def __init__(self, target, drafter, max_len: int, block_size: int | None = None, mode: str = "auto",
                 compile: bool | str = False, grouped_attention: bool = True, fuse_projections: bool = False,
                 linear: str = "default", compile_steps: tuple[str, ...] = STEPS):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        compile_mode = "default" if compile is True else (compile or None)
        if compile_mode is not None and compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile must be a bool or one of {COMPILE_MODES}, got {compile!r}")
        if not compile_steps or set(compile_steps) - set(STEPS):
            raise ValueError(f"compile_steps must be a non-empty subset of {STEPS}, got {compile_steps!r}")
        self.target, self.drafter = target, drafter
        self.device = target.device
        on_cuda = self.device.type == "cuda"
        self.use_graph = on_cuda if mode == "auto" else mode == "cudagraph"
        if self.use_graph and not on_cuda:
            raise ValueError("mode 'cudagraph' needs a CUDA target")
        cfg = drafter.config
        native = int(drafter.block_size)
        self.block = native if block_size is None else int(block_size)
        if not 2 <= self.block <= native:
            raise ValueError(f"block_size must be in 2..{native} (the drafter's), got {block_size}")
        self.layer_ids = list(drafter_setting(cfg, "target_layer_ids"))
        self.mask_token_id = int(drafter_setting(cfg, "mask_token_id"))
        self.choose = block_chooser(drafter)
        self.max_len = int(max_len)
        self.dtype = target.lm_head_weight.dtype
        # the captured steps' experts kernel for a MoE target (None: the model's own; see .experts)
        self.step_experts = CAPTURE_SAFE if needs_capture_safe_experts(target.model, self.dtype, self.use_graph) else None
        self.own_experts = getattr(target.model.config, "_experts_implementation", None)
        self.drafter_dtype = next(drafter.parameters()).dtype
        self.kv = KVBuffers.for_model(target.model, self.device)
        self.kv.view(1, self.max_len)
        first = drafter.layers[0].self_attn
        self.dcache = DrafterContextCache.slotted(len(drafter.layers), first.num_kv_heads, first.head_dim,
                                                  self.max_len + 1, self.drafter_dtype, self.device)
        self.cols = torch.arange(self.max_len, device=self.device)
        self.grouped_attention = grouped_attention
        self.linear = check_linear_mode(linear)
        self.fused = FusedProjections(target.layers) if fuse_projections else None
        self.tap = _FeatureTap(target.layers, self.layer_ids)
        self._inputs()
        self.compile_steps = tuple(s for s in STEPS if s in compile_steps) if compile_mode else ()
        modes = {s: compile_mode if s in self.compile_steps else None for s in STEPS}
        self.verify_step = _Graphed(self._verify, self.use_graph, modes["verify"])
        self.plain_step = _Graphed(self._plain, self.use_graph, modes["plain"])
        self.draft_step = _Graphed(lambda: self._draft(self.new_features, self.num_new, self.anchor_pos, self.anchor),
                                   self.use_graph, modes["draft"])

    def _inputs(self) -> None:
        """The fixed tensors the captured steps read (written before each replay)."""
        dev, b = self.device, self.block
        width = len(self.layer_ids) * self.target.facts.hidden_size
        self.verify_ids = torch.zeros(1, b, dtype=torch.long, device=dev)
        self.verify_pos = torch.zeros(1, b, dtype=torch.long, device=dev)
        self.plain_ids = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.plain_pos = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.new_features = torch.zeros(1, b, width, dtype=self.dtype, device=dev)
        self.num_new = torch.zeros(1, dtype=torch.long, device=dev)
        self.anchor_pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.anchor = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.offsets = torch.arange(b, device=dev)
        self.mask_ids = torch.full((1, b - 1), self.mask_token_id, dtype=torch.long, device=dev)

    # ------------------------------------------------------------------ the forwards
    def _target(self, ids: torch.Tensor, pos: torch.Tensor, features: bool):
        """Target forward of ``ids`` [1, q] at positions ``pos`` [1, q]: (logits [q, V] in the
        target's dtype, features). Argmax needs no float copy: widening is exact."""
        neg = torch.finfo(self.dtype).min
        mask = torch.where(self.cols[None, :] <= pos[0][:, None], 0.0, neg).to(self.dtype)[None, None]
        self.kv.pos, self.kv.rows = pos[0], slice(None)
        out = self.target.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                                **{cache_kwarg(self.target.model): self.kv})
        feats = self.tap.features() if features else None
        return out.logits[0], feats

    def _verify(self):
        """The graphed verify step: ([drafts ; target argmax] as 2(B-1)+1 ids, features)."""
        logits, features = self._target(self.verify_ids, self.verify_pos, True)
        return torch.cat([self.verify_ids[0, 1:], logits.argmax(-1)]), features

    def _plain(self):
        """The graphed plain step: (last logits [V], their argmax)."""
        logits, _ = self._target(self.plain_ids, self.plain_pos, False)
        return logits[-1].float(), logits[-1].argmax()  # float: recorded top-k values, as the reference

    def _draft(self, features: torch.Tensor, num_new: torch.Tensor, p: torch.Tensor, anchor: torch.Tensor):
        """Drafts for positions ``p+1 .. p+B-1`` after adding the first ``num_new`` rows of
        ``features`` (positions ``p-num_new .. p-1``) to the drafter's context."""
        rows = torch.arange(features.shape[1], device=self.device)
        ctx_pos = (p - num_new + rows)[None]
        self.dcache.write_pos = torch.where(rows < num_new, ctx_pos[0], self.max_len)  # unused rows -> scratch
        block_pos = (p + self.offsets)[None]
        block_ids = torch.cat([anchor, self.mask_ids], dim=1)
        hidden = block_hidden(self.target, self.drafter, block_ids, features, block_pos, ctx_pos.clamp(min=0),
                              self._masks(p), self.dcache, self.drafter_dtype)[0, 1:]
        return self.choose(hidden, block_logits(self.target, hidden), anchor[0], GREEDY).tokens

    def _masks(self, p: torch.Tensor) -> dict:
        """The block anchored at ``p`` over every drafter slot: slots at or after ``p``
        (stale context, the scratch slot) are hidden by the anchor rule."""
        return decode_masks(self.drafter.layer_types, p, self.max_len + 1, self.block,
                            self.drafter.sliding_window, self.device)

    # ------------------------------------------------------------------ decoding
    @contextlib.contextmanager
    def patched(self):
        """The target as the steps run it: grouped attention, fused projections (if on), the
        few-row matmul formulation. Restored on exit, so reference loops sharing the target
        run it unchanged."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(grouped_sdpa(self.target.model, self.grouped_attention))
            stack.enter_context(skinny_linear(self.linear))
            stack.enter_context(self.tap.armed())
            stack.enter_context(experts_as(self.target.model, self.step_experts))
            if self.fused is not None:
                stack.enter_context(self.fused.applied())
            yield

    def _check_length(self, prompt_len: int, max_new_tokens: int) -> None:
        if prompt_len + max_new_tokens + self.block > self.max_len:
            raise ValueError(f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) + block ({self.block}) "
                             f"exceeds the decoder's max_len {self.max_len}")

    def _prefill(self, input_ids: torch.Tensor, features: bool):
        n = input_ids.shape[1]
        pos = torch.arange(n, device=self.device)[None]
        with experts_as(self.target.model, self.own_experts if self.step_experts else None):  # not captured
            return self._target(input_ids.to(self.device), pos, features)

    @torch.no_grad()
    def speculative(self, input_ids: torch.Tensor, max_new_tokens: int, stop_token_ids=()) -> SpecResult:
        """Greedy DFlash decoding; the same result fields as ``speculative_generate``."""
        with self.patched():
            return self._speculative(input_ids, max_new_tokens, stop_token_ids)

    def _speculative(self, input_ids: torch.Tensor, max_new_tokens: int, stop_token_ids) -> SpecResult:
        self._check_length(input_ids.shape[1], max_new_tokens)
        return speculative_loop(_SpecSteps(self), input_ids, max_new_tokens, self.block, stop_token_ids,
                                _Clock(self.device))

    def _next_drafts(self, features: torch.Tensor, num_new: int, p: int, anchor: int) -> torch.Tensor:
        """The graphed draft step anchored at ``p`` after ``num_new`` verified features."""
        self.new_features.copy_(features)
        self.num_new.fill_(num_new)
        self.anchor_pos.fill_(p)
        self.anchor.fill_(anchor)
        return self.draft_step()

    @torch.no_grad()
    def plain(self, input_ids: torch.Tensor, max_new_tokens: int, stop_token_ids=(), record_topk: int = 0
              ) -> GenResult:
        """Greedy target-only decoding, one token per (graphed) step."""
        with self.patched():
            return self._plain_loop(input_ids, max_new_tokens, stop_token_ids, record_topk)

    def _plain_loop(self, input_ids, max_new_tokens, stop_token_ids, record_topk) -> GenResult:
        self._check_length(input_ids.shape[1], max_new_tokens)
        return plain_loop(_PlainSteps(self), input_ids, max_new_tokens, stop_token_ids, record_topk, _Clock(self.device))


class _SpecSteps:
    """The static engine's speculative steps (:class:`~.core.SpecSteps`): the graphed draft step
    (the first block eagerly, over the prompt's variable-length features), the graphed verify
    step, and one host sync per step in :meth:`accept` (drafts and the target's argmax come back
    together). Keeping a prefix moves no data: the next draft step brings the verified features,
    and stale K/V (rejected drafts) are masked, then overwritten. Per step it writes only the
    fixed input tensors the graphs read; nothing is allocated."""

    def __init__(self, decoder: StaticDecoder) -> None:
        self.d = decoder
        self.features = self.prompt_len = self.p = self.num_new = None

    def prefill(self, input_ids: torch.Tensor) -> int:
        logits, self.features = self.d._prefill(input_ids, True)
        first = int(logits[-1].argmax())
        self.prompt_len = self.p = self.num_new = input_ids.shape[1]  # p: the anchor's position
        self.d.anchor.fill_(first)
        return first

    def draft(self, generated: list[int]) -> None:
        d, anchor = self.d, generated[-1]
        if len(generated) == 1:  # the prompt's features enter the drafter's context eagerly (variable length)
            drafts = d._draft(self.features, torch.tensor(self.prompt_len, device=d.device),
                              torch.tensor(self.p, device=d.device), d.anchor)
        else:
            drafts = d._next_drafts(self.features, self.num_new, self.p, anchor)
        d.verify_ids[0, 0] = anchor  # the verify step's inputs, written before its launch
        d.verify_ids[0, 1:].copy_(drafts)
        torch.add(d.offsets, self.p, out=d.verify_pos[0])

    def verify(self, _block: None):
        return self.d.verify_step()

    def accept(self, pending) -> tuple[list[int], int, int]:
        both, self.features = pending
        both = both.tolist()  # the one host sync per verify step
        num_draft = self.d.block - 1
        draft_list, choice = both[:num_draft], both[num_draft:]
        accepted = leading_matches(draft_list, choice)
        return draft_list, accepted, choice[accepted]

    def keep(self, accepted: int) -> None:
        self.p += accepted + 1
        self.num_new = accepted + 1


class _PlainSteps:
    """The static engine's plain steps (:class:`~.core.PlainSteps`): the prompt eagerly, then one
    graphed one-token step (its inputs written in place; the argmax read after the logits are kept)."""

    def __init__(self, decoder: StaticDecoder) -> None:
        self.d = decoder

    def prefill(self, input_ids: torch.Tensor):
        logits, _ = self.d._prefill(input_ids, False)
        logits = logits[-1].float()
        return logits, logits.argmax()

    def step(self, token: int, position: int):
        self.d.plain_ids.fill_(token)
        self.d.plain_pos.fill_(position)
        return self.d.plain_step()
