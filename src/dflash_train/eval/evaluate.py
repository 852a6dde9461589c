"""Acceptance length (tau), speed and the lossless check over a set of prompts.

:func:`evaluate` takes already-loaded models and token ids, so the trainer can call it
every N steps on a small held-out set (``baseline=False`` skips the target-only
decode and keeps it cheap). The ``eval`` CLI adds prompt files, the chat template,
a JSON report, a console table and a PNG.

Lossless check (temperature 0): the speculative tokens must equal plain greedy decoding
token for token. In float32 any divergence fails. In half precision, verifying a block
in one forward and decoding one token at a time reduce in different orders, so the two
can part at a near-tie; a divergence passes only if, in the plain decode's logits at
that position, the speculative token is within :data:`TIE_TOLERANCE` of the top logit.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dflash_train.decoding.core import GenResult, SpecResult, tally
from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.files import atomic_write_text, explained, write_figure

# Largest gap (plain decode's top-1 logit minus the logit of the token speculative decoding
# chose) that still counts as a rounding near-tie at the first divergence.
# bf16 keeps 8 significant bits: logits of magnitude 16..32 sit on a 0.125 grid, and
# verifying B tokens in one forward vs one token at a time changes reduction orders and
# kernels, which moves logits by a few ulps. Measured on SmolLM2-135M-Instruct (bf16,
# 3 chat prompts x 49 positions, blocks of 16 vs sequential): the top-1 minus top-2 gap
# moved by at most 0.375 on CPU (p50 0.125) and 0.25 on an H200 (p50 0.0); a 6-prompt
# x 128-token GPU eval diverged 3 times, at gaps 0.0, 0.0 and 0.125. 0.5 logits (4 ulps
# at |logit| < 32) covers that; a real decision error shows up as a divergence at a gap
# of whole logits on some prompt. fp16 (3 more bits) gets 0.125; float32 must match.
TIE_TOLERANCE = {torch.float32: 0.0, torch.float64: 0.0, torch.bfloat16: 0.5, torch.float16: 0.125}
TOPK_RECORDED = 8


def default_stop_token_ids(target) -> list[int]:
    """eos ids of the tokenizer and the generation config."""
    ids: list[int] = []
    gen = getattr(target.model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(target.tokenizer, "eos_token_id", None)):
        if src is None:
            continue
        ids += [int(x) for x in (src if isinstance(src, (list, tuple)) else [src])]
    return sorted(set(ids))


def compare_greedy(spec_tokens: list[int], plain: GenResult, tolerance: float) -> dict:
    """Lossless verdict for one prompt: ``{"ok", "diverged_at", "spec_token", "plain_token",
    "top2_gap", "spec_token_gap"}``. ``plain`` must carry top-k logits."""
    n = min(len(spec_tokens), len(plain.tokens))
    first = next((i for i in range(n) if spec_tokens[i] != plain.tokens[i]), None)
    if first is None:
        if len(spec_tokens) == len(plain.tokens):
            return {"ok": True, "diverged_at": None}
        return {"ok": False, "diverged_at": n, "reason": f"length {len(spec_tokens)} vs plain {len(plain.tokens)}"}
    verdict = {"ok": False, "diverged_at": first, "spec_token": spec_tokens[first], "plain_token": plain.tokens[first]}
    if plain.topk_values is None:
        return {**verdict, "reason": "no plain logits recorded"}
    vals, ids = plain.topk_values[first], plain.topk_ids[first].tolist()
    verdict["top2_gap"] = float(vals[0] - vals[1])
    if spec_tokens[first] in ids:
        gap = float(vals[0] - vals[ids.index(spec_tokens[first])])
        verdict["spec_token_gap"] = gap
        verdict["ok"] = tolerance > 0 and gap <= tolerance
    else:
        verdict["spec_token_gap"] = None  # not even in the plain decode's top-k: a real error
    verdict["tolerance"] = tolerance
    return verdict


def _safe_div(a: float, b: float) -> float:
    return a / b if b else 0.0


TAU_DEFINITION = ("tokens committed / target verify steps: the prefill's token is not a step, a step cut by a "
                  "stop token or max_new_tokens counts what it kept; mean_tau pools the steps of all prompts, "
                  "mean_tau_per_prompt averages each prompt's own")


def summarize(spec: list[SpecResult], plain: list[GenResult] | None, block_size: int) -> dict:
    """Aggregate statistics: tau pooled over all verify steps of all prompts and averaged over
    prompts (:data:`TAU_DEFINITION`), the histogram and per-position rates of the acceptance as
    verified, times."""
    counted = tally(spec, block_size - 1)
    spec_tokens = sum(max(0, len(r.tokens) - 1) for r in spec)
    spec_time = sum(r.decode_time for r in spec)
    out = {
        "num_prompts": len(spec),
        "block_size": block_size,
        "num_verify_steps": counted.num_steps,
        "mean_tau": counted.tau(),
        "mean_tau_per_prompt": counted.per_prompt_tau(),
        "tau_definition": TAU_DEFINITION,
        "verified_tau": counted.verified_tau(),
        "tau_per_prompt": counted.prompt_taus(),
        "acceptance_histogram": counted.histogram(block_size),
        "per_position_reached": counted.position_reached,
        "per_position_accepted": counted.position_accepted,
        "per_position_acceptance": counted.position_rates(),
        "generated_tokens": sum(len(r.tokens) for r in spec),
        "spec_decode_tokens_per_s": _safe_div(spec_tokens, spec_time),
        "spec_draft_time_s": sum(r.draft_time for r in spec),
        "spec_verify_time_s": sum(r.verify_time for r in spec),
    }
    steps = counted.num_steps
    out["ms_per_draft_step"] = 1e3 * _safe_div(out["spec_draft_time_s"], steps)
    out["ms_per_verify_step"] = 1e3 * _safe_div(out["spec_verify_time_s"], steps)
    if plain is not None:
        plain_tokens = sum(max(0, len(r.tokens) - 1) for r in plain)
        out["target_decode_tokens_per_s"] = _safe_div(plain_tokens, sum(r.decode_time for r in plain))
        out["speedup"] = _safe_div(out["spec_decode_tokens_per_s"], out["target_decode_tokens_per_s"])
        # the time split per verify step against one plain step; speculation pays when tau > break-even
        out["ms_per_plain_step"] = 1e3 * _safe_div(1.0, out["target_decode_tokens_per_s"])
        out["break_even_tau"] = _safe_div(out["ms_per_draft_step"] + out["ms_per_verify_step"],
                                          out["ms_per_plain_step"])
    return out


@dataclass
class EvalOptions:
    """How ``evaluate`` decodes and what it measures (defaults: greedy, 128 new tokens,
    the drafter's own block size, a target-only baseline with the lossless check)."""

    max_new_tokens: int = 128
    block_size: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    stop_token_ids: list[int] | None = None
    baseline: bool = True
    lossless_check: bool | None = None
    tie_tolerance: float | None = None
    seed: int = 0
    warmup: bool = True
    progress: bool = False
    # a line per prompt through this function (training's held-out evaluation: no silent minute on a CPU)
    echo: Callable[[str], None] | None = None
    engine: str = "hf"
    compile: bool | str | None = None  # static engine: torch.compile the steps (None: on CUDA only; str: mode)
    # which static steps compile: the drafter's alone by default, so the target runs the same (uncompiled,
    # graphed) kernels in the plain baseline and in verification; on an H200 this took SmolLM2's draft step
    # from 0.93 to 0.32 ms in bf16 (docs/results/smollm2-h200-4); ("plain", "verify", "draft"): all three
    compile_steps: tuple[str, ...] = ("draft",)
    linear: str = "auto"  # static engine: few-row float32 matmuls (decoding/skinny.py); auto: see static_layout
    fuse_projections: bool | None = None  # static engine: one GEMM for q/k/v and gate/up (None: on CUDA)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.engine not in ("auto", "hf", "static"):
            raise ValueError(f"engine must be 'auto', 'hf' or 'static', got {self.engine!r}")


@torch.no_grad()
def evaluate(target, drafter, prompts_token_ids, options: EvalOptions | None = None, **fields) -> dict:
    """Speculative decoding over ``prompts_token_ids`` (list of 1-D token id lists/tensors).

    ``drafter``: a loaded :class:`DFlashDrafter` (unwrap DDP/compile first) or a
    ``Proposer``; its train/eval mode is restored afterwards. ``baseline`` also decodes
    every prompt with the target alone (tokens/s and speedup); ``lossless_check``
    (default: on when ``baseline`` and greedy) compares the two token for token.
    ``stop_token_ids`` defaults to the target's eos ids. Options come as an ``EvalOptions`` or
    as its field names (``evaluate(t, d, ids, max_new_tokens=64, baseline=False)``). Returns a JSON-able dict;
    ``report["lossless"]["ok"]`` is False on any failed prompt. ``engine`` "hf" runs the
    reference loops of :mod:`dflash_train.decoding.speculative` (Hugging Face cache, any temperature); "static"
    runs :class:`~dflash_train.decoding.static.StaticDecoder` (greedy only; CUDA graphs on GPU), which measures
    decoding speed without most of the Python overhead of a small target; "auto" picks
    "static" when greedy and "hf" otherwise.
    """
    opts = options or EvalOptions(**fields)
    if options is not None and fields:
        raise ValueError("pass either an EvalOptions or its fields, not both")
    opts = replace(opts, engine=resolve_engine(opts.engine, opts.temperature))
    was_training = getattr(drafter, "training", None)
    if was_training:
        drafter.eval()
    try:
        return _evaluate(target, drafter, prompts_token_ids, opts)
    finally:
        if was_training:
            drafter.train()


def resolve_engine(engine: str, temperature: float) -> str:
    """``auto``: the static engine where it applies (greedy), the reference loops otherwise."""
    if engine != "auto":
        return engine
    return "static" if temperature <= 0 else "hf"


def static_compile(compile: bool | str | None, device) -> bool | str:
    """The static engine compiles its steps on CUDA by default (launch-bound steps: fewer,
    fused kernels); CPU steps are compute-bound and compile slowly. A string is an
    inductor mode (compile on)."""
    return torch.device(device).type == "cuda" if compile is None else compile


def static_layout(linear: str, fuse_projections: bool | None, target) -> tuple[str, bool]:
    """The static engine's matmul layout. ``auto``: split-K few-row matmuls for a float32
    target on CUDA (an H200 verify step of SmolLM2 went from 7.8 to 4.1 ms with fused
    projections, docs/results/smollm2-h200-3), cuBLAS as is elsewhere; fused projections on
    CUDA unless set. Both change rounding only."""
    on_cuda = target.device.type == "cuda"
    if linear == "auto":
        linear = "splitk" if on_cuda and target.lm_head_weight.dtype == torch.float32 else "default"
    return linear, on_cuda if fuse_projections is None else bool(fuse_projections)


def _decoders(engine, target, drafter, prompts, max_new_tokens, block, common, compile=False,
              layout=("default", False), compile_steps=("draft",)):
    """(speculative, plain) callables ``f(ids, n, generator, **extra)`` for ``engine``."""
    if engine == "hf":
        def spec(ids, n, generator):
            return speculative_generate(target, drafter, ids, n, block_size=block, generator=generator, **common)

        def plain(ids, n, generator, record_topk=0):
            return target_generate(target, ids, n, generator=generator, record_topk=record_topk, **common)
        return spec, plain
    if engine != "static":
        raise ValueError(f"engine must be 'auto', 'hf' or 'static', got {engine!r}")
    if common["temperature"] > 0:
        raise ValueError("engine 'static' decodes greedily only: use temperature 0 or engine 'hf'")
    from dflash_train.decoding.static import StaticDecoder

    longest = max(p.shape[1] for p in prompts)
    linear, fuse_projections = layout
    decoder = StaticDecoder(target, drafter, max_len=-(-(longest + max_new_tokens + block + 1) // 64) * 64,
                            block_size=block, compile=compile, linear=linear, fuse_projections=fuse_projections,
                            compile_steps=tuple(compile_steps))
    stop = common["stop_token_ids"]
    return (lambda ids, n, generator: decoder.speculative(ids, n, stop),
            lambda ids, n, generator, record_topk=0: decoder.plain(ids, n, stop, record_topk=record_topk))


@dataclass
class _Settings:
    """What ``_evaluate`` resolves from the options and the models before decoding."""

    stop: list[int]
    lossless_check: bool
    tolerance: float
    block: int
    compile_mode: bool | str
    layout: tuple[str, bool]


def _settings(target, drafter, opts: EvalOptions) -> _Settings:
    stop = default_stop_token_ids(target) if opts.stop_token_ids is None else [int(t) for t in opts.stop_token_ids]
    greedy = opts.temperature <= 0
    lossless_check = opts.baseline and greedy if opts.lossless_check is None else opts.lossless_check
    if lossless_check and not (opts.baseline and greedy):
        raise ValueError("the lossless check needs temperature 0 and the target-only baseline")
    dtype = target.lm_head_weight.dtype
    tolerance = TIE_TOLERANCE.get(dtype, 0.0) if opts.tie_tolerance is None else float(opts.tie_tolerance)
    block = int(drafter.block_size) if opts.block_size is None else int(opts.block_size)
    return _Settings(stop, lossless_check, tolerance, block, static_compile(opts.compile, target.device),
                     static_layout(opts.linear, opts.fuse_projections, target))


def _evaluate(target, drafter, prompts, opts: EvalOptions) -> dict:
    prompts = [torch.as_tensor(p, dtype=torch.long).view(1, -1) for p in prompts]
    if not prompts:
        raise ValueError("no prompts to evaluate")
    run = _settings(target, drafter, opts)
    common = {"temperature": opts.temperature, "top_p": opts.top_p, "stop_token_ids": run.stop}
    spec_fn, plain_fn = _decoders(opts.engine, target, drafter, prompts, opts.max_new_tokens, run.block, common,
                                  run.compile_mode, run.layout, opts.compile_steps)
    gen = torch.Generator(device=target.device)
    if opts.warmup:  # first calls pay for allocator / kernel selection / graph capture / compilation; keep them
        # out of the timings. 2B+1 tokens: even a fully accepted first block leaves a draft step to run
        n = min(2 * run.block + 1, opts.max_new_tokens)
        spec_fn(prompts[0], n, gen.manual_seed(opts.seed))
        if opts.baseline:
            plain_fn(prompts[0], n, gen.manual_seed(opts.seed))
    spec, plain, verdicts = _decode_prompts(spec_fn, plain_fn, prompts, opts, run, gen)
    return _report(target, prompts, spec, plain, verdicts, opts, run)


def _decode_prompts(spec_fn, plain_fn, prompts, opts: EvalOptions, run: _Settings, gen):
    """Every prompt decoded speculatively (and plainly, with the baseline); the lossless verdicts."""
    spec, plain, verdicts = [], [] if opts.baseline else None, []
    iterator = range(len(prompts))
    if opts.progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc="eval", unit="prompt")
    for i in iterator:
        ids = prompts[i]
        started = time.perf_counter()
        if opts.baseline:
            plain.append(plain_fn(ids, opts.max_new_tokens, gen.manual_seed(opts.seed + i),
                                  record_topk=TOPK_RECORDED if run.lossless_check else 0))
        spec.append(spec_fn(ids, opts.max_new_tokens, gen.manual_seed(opts.seed + i)))
        if run.lossless_check:
            verdict = compare_greedy(spec[-1].tokens, plain[-1], run.tolerance)
            verdicts.append(verdict)
            if opts.progress and verdict["diverged_at"] is not None:
                iterator.write(f"prompt {i}: speculative output diverges at token {verdict['diverged_at']}: {verdict}")
        if opts.progress:
            iterator.set_postfix(tau=f"{spec[-1].mean_tau:.2f}")
        if opts.echo is not None:
            opts.echo(f"prompt {i + 1}/{len(prompts)}: tau {spec[-1].mean_tau:.2f}, "
                      f"{len(spec[-1].tokens)} tokens in {time.perf_counter() - started:.1f}s")
    return spec, plain, verdicts


def _report(target, prompts, spec, plain, verdicts, opts: EvalOptions, run: _Settings) -> dict:
    report = summarize(spec, plain, run.block)
    report.update({
        "max_new_tokens": opts.max_new_tokens, "temperature": opts.temperature, "top_p": opts.top_p,
        "dtype": str(target.lm_head_weight.dtype).removeprefix("torch."), "device": str(target.device),
        "stop_token_ids": run.stop, "engine": opts.engine,
        **({"static_compile": run.compile_mode,
            "static_compiled_steps": list(opts.compile_steps) if run.compile_mode else [],
            "static_linear": run.layout[0], "static_fused_projections": run.layout[1]}
           if opts.engine == "static" else {}),
    })
    report["lossless"] = _lossless(verdicts, run.tolerance) if run.lossless_check else {"checked": False, "ok": None}
    report["prompts"] = [
        {"prompt_tokens": int(p.shape[1]), "new_tokens": len(s.tokens), "tau": s.mean_tau,
         "kept_lengths": s.kept_lengths, "acceptance_lengths": s.acceptance_lengths,
         "spec_decode_tokens_per_s": s.decode_tokens_per_s,
         **({"target_decode_tokens_per_s": g.decode_tokens_per_s} if plain is not None else {})}
        for p, s, g in zip(prompts, spec, plain if plain is not None else [None] * len(spec))
    ]
    return report


def _lossless(verdicts: list[dict], tolerance: float) -> dict:
    failed = [i for i, v in enumerate(verdicts) if not v["ok"]]
    return {"checked": True, "ok": not failed, "tolerance": tolerance, "failed_prompts": failed,
            "near_tie_divergences": [i for i, v in enumerate(verdicts) if v["ok"] and v["diverged_at"] is not None],
            "per_prompt": verdicts}


# ---------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------
def format_table(report: dict) -> str:
    """A short console summary."""
    def fmt(x, spec=".2f"):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    rows = [
        ("prompts", str(report["num_prompts"])),
        ("block size", str(report["block_size"])),
        ("verify steps", str(report["num_verify_steps"])),
        ("tau (kept tokens / verify step)", f"{fmt(report['mean_tau'], '.3f')} pooled over steps, "
                                            f"{fmt(report.get('mean_tau_per_prompt'), '.3f')} per-prompt mean"),
        ("tau per prompt (min/max)", f"{fmt(min(report['tau_per_prompt']))} / {fmt(max(report['tau_per_prompt']))}"),
        ("spec decode tok/s", fmt(report["spec_decode_tokens_per_s"], ".1f")),
        ("target decode tok/s", fmt(report.get("target_decode_tokens_per_s"), ".1f")),
        ("speedup", fmt(report.get("speedup")) + ("x" if report.get("speedup") is not None else "")),
        ("ms per draft / verify / plain step", f"{fmt(report.get('ms_per_draft_step'))} / "
                                                f"{fmt(report.get('ms_per_verify_step'))} / "
                                                f"{fmt(report.get('ms_per_plain_step'))}"),
        ("break-even tau", fmt(report.get("break_even_tau"))),
    ]
    acc = report["per_position_acceptance"]
    if acc:
        rows.append(("accept rate pos 1..", " ".join(fmt(a) for a in acc[:8]) + (" ..." if len(acc) > 8 else "")))
    ll = report["lossless"]
    if ll["checked"]:
        status = "PASS" if ll["ok"] else f"FAIL on prompts {ll['failed_prompts']}"
        if ll["near_tie_divergences"]:
            status += f" ({len(ll['near_tie_divergences'])} near-tie divergences within {ll['tolerance']})"
        rows.append(("lossless check", status))
    else:
        rows.append(("lossless check", "off"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def plot_report(report: dict, path: str | os.PathLike) -> Path:
    """PNG: histogram of accepted lengths and per-position acceptance rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    hist = report["acceptance_histogram"]
    lengths = sorted(int(k) for k in hist)
    total = max(1, sum(hist.values()))
    ax1.bar(lengths, [hist[str(k)] / total for k in lengths], color="tab:blue")
    ax1.axvline(report["mean_tau"], color="tab:red", ls="--", label=f"mean tau {report['mean_tau']:.2f}")
    ax1.set_xlabel("acceptance length tau (accepted drafts + 1)")
    ax1.set_ylabel("fraction of verify steps")
    ax1.set_xticks(lengths)
    ax1.legend()
    acc = report["per_position_acceptance"]
    pos = list(range(1, len(acc) + 1))
    ax2.plot(pos, [a if a is not None else float("nan") for a in acc], marker="o", color="tab:green")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("draft position k")
    ax2.set_ylabel("P(k accepted | k reached)")
    if pos:
        ax2.set_xticks(pos)
    fig.suptitle(f"DFlash eval: {report['num_prompts']} prompts, block {report['block_size']}, "
                 f"T={report['temperature']}")
    fig.tight_layout()
    return write_figure(fig, path, "eval plot", REPORT_TODO)


REPORT_TODO = "free space or choose another output folder"


def write_report(report: dict, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``eval.json`` and ``eval.png`` into ``out_dir``, each atomically: a failure (no
    space, read-only, ...) is one line naming the file, an earlier report intact, no temp left."""
    out = Path(out_dir)
    with explained("cannot write the eval report folder", out, REPORT_TODO):
        out.mkdir(parents=True, exist_ok=True)
    json_path = out / "eval.json"
    atomic_write_text(json_path, json.dumps(report, indent=2), "eval report", REPORT_TODO)
    return json_path, plot_report(report, out / "eval.png")
