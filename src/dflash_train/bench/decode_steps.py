"""Time the static decoder's three steps (plain, verify, draft) under several variants.

    dflash-train bench-decode --target assets/smollm2 --dtype float32 \\
        --device cuda --out steps.json [--drafter FOLDER] [--variants eager,cudagraph,...]

Why: speculative decoding pays only if ``tau > (verify + draft) / plain`` (the break-even
acceptance length), so each step's cost is what to optimise. Each variant builds its own
:class:`~dflash_train.decoding.static.StaticDecoder`, decodes one prompt (capture, compile), then replays each
step ``--replays`` times on fixed inputs (replays are idempotent: same K/V, same slots)
and reports the median and p10/p90 in ms (CUDA events on GPU, ``perf_counter`` on CPU).
It also reports a real decode of ``--new-tokens`` per variant (host overhead included)
and, on CUDA, the kernels of one uncompiled and one compiled call of each step
(``torch.profiler``). A variant that fails reports its error; the JSON is rewritten
after every variant, so a timeout keeps what was measured.

Without ``--drafter`` the drafter is randomly initialised in the recipe's shape (4
layers, block 16, default feature layers; ``--drafter-kind dflash2`` for DFlash2): a step's cost
does not depend on its weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
import warnings

import torch

from dflash_train.bench import kernels
from dflash_train.cli_types import at_least, positive_float, positive_int
from dflash_train.decoding.static import STEPS, StaticDecoder
from dflash_train.files import atomic_write_text
from dflash_train.models.kinds import kind_names

# name -> StaticDecoder options; the default list on CUDA runs them all in this order, the slow
# autotuning last
VARIANTS = {
    "eager": {"mode": "eager"},
    "cudagraph-stock": {"mode": "cudagraph", "grouped_attention": False},  # the previous engine
    "cudagraph": {"mode": "cudagraph"},
    "cudagraph-cublaslt": {"mode": "cudagraph", "linear": "cublaslt"},
    "cudagraph-splitk": {"mode": "cudagraph", "linear": "splitk"},
    "compile+cudagraph-splitk": {"mode": "cudagraph", "compile": "default", "linear": "splitk"},
    "compile+cudagraph-mm_t": {"mode": "cudagraph", "compile": "default", "linear": "mm_t"},
    "compile+cudagraph-cublaslt": {"mode": "cudagraph", "compile": "default", "linear": "cublaslt"},
    "compile-draft+cudagraph-fused": {"mode": "cudagraph", "compile": "default", "compile_steps": ("draft",),
                                      "fuse_projections": True},
    "compile-draft+cudagraph-fused-splitk": {"mode": "cudagraph", "compile": "default", "compile_steps": ("draft",),
                                            "fuse_projections": True, "linear": "splitk"},
    "compile+cudagraph-fused-splitk": {"mode": "cudagraph", "compile": "default", "fuse_projections": True,
                                       "linear": "splitk"},
    "compile+cudagraph": {"mode": "cudagraph", "compile": "default"},
    "cudagraph-fused": {"mode": "cudagraph", "fuse_projections": True},
    "cudagraph-fused-splitk": {"mode": "cudagraph", "fuse_projections": True, "linear": "splitk"},
    "compile+cudagraph-fused": {"mode": "cudagraph", "compile": "default", "fuse_projections": True},
    "compile": {"mode": "eager", "compile": "default"},
    "compile+cudagraph-stock": {"mode": "cudagraph", "compile": "default", "grouped_attention": False},
    "autotune+cudagraph": {"mode": "cudagraph", "compile": "max-autotune-no-cudagraphs"},
}
CPU_VARIANTS = ("eager", "compile")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The benchmark's flags (numbers range-checked: one line naming the flag)."""
    ap.add_argument("--target", required=True, help="target model folder")
    ap.add_argument("--drafter", default=None, help="an exported drafter folder (default: random, recipe shape)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="model dtype")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--out", default=None, help="also write the JSON report here (rewritten after every variant)")
    ap.add_argument("--variants", default=None, help=f"comma list of {list(VARIANTS)}")
    ap.add_argument("--replays", type=positive_int, default=200, help="timed replays of each step per variant")
    ap.add_argument("--prompt-len", type=positive_int, default=64, help="tokens of the synthetic prompt")
    ap.add_argument("--new-tokens", type=positive_int, default=128, help="tokens of the real decode per variant")
    ap.add_argument("--block-size", type=at_least(2), default=16, help="drafter block size (>= 2)")
    ap.add_argument("--drafter-layers", type=positive_int, default=4,
                    help="layers of the random drafter (without --drafter)")
    ap.add_argument("--drafter-kind", choices=kind_names(), default="dflash",
                    help="kind of the random drafter (without --drafter): its network and its chooser join the "
                         "draft step (models/kinds/, decoding/choosers/)")
    ap.add_argument("--time-budget-s", type=positive_float, default=None,
                    help="start no new variant after this many seconds (the rest report 'skipped')")


def register(sub) -> None:
    """``dflash-train bench-decode``."""
    p = sub.add_parser("bench-decode", help="time the static decoder's plain, verify and draft steps under several variants (JSON)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=command)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return ap.parse_args(argv)


def load_pair(args):
    from dflash_train.models.target import Target

    dtype = getattr(torch, args.dtype)
    target = Target.load(args.target, dtype=dtype, device=args.device)
    if args.drafter:
        from dflash_train.eval.loader import load_drafter_folder

        return target, load_drafter_folder(args.drafter, target)
    from dflash_train.models.config import DrafterConfig, resolve_drafter_config
    from dflash_train.models.drafter import DFlashDrafter

    cfg = resolve_drafter_config(DrafterConfig(num_hidden_layers=args.drafter_layers, block_size=args.block_size,
                                               kind=args.drafter_kind),
                                 target.facts, mask_token_id=target.facts.vocab_size - 1)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).to(device=target.device, dtype=dtype)
    return target, drafter.eval().requires_grad_(False)


def _percentiles(ms: list[float]) -> dict:
    ordered = sorted(ms)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(ordered), "p10_ms": pick(0.1), "p90_ms": pick(0.9), "n": len(ordered)}


def time_step(step, replays: int, device) -> dict:
    """Per-call times of ``step()``; on CUDA each call sits between two events."""
    step()  # capture / compile before timing
    if device.type == "cuda":
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(replays)]
        for start, end in events:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        return _percentiles([start.elapsed_time(end) for start, end in events])
    ms = []
    for _ in range(replays):
        t0 = time.perf_counter()
        step()
        ms.append(1e3 * (time.perf_counter() - t0))
    return _percentiles(ms)


def kernel_profile(fn, device, top: int = 8) -> dict | None:
    """GPU activities (kernels, memcpy/memset) of one call of ``fn`` after a warm-up call:
    their count, summed GPU time and the ``top`` by total time. ``None`` off CUDA; a
    profiler failure is reported, not raised (the timings matter more)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        events = [(e.name, e.time_range.elapsed_us()) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA and not kernels.is_annotation(e)]
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {err}"}
    return rank_kernels(events, top)


def rank_kernels(events: list[tuple[str, float]], top: int) -> dict:
    """(name, microseconds) of one call's device activities -> their count, total and the ``top``
    by total time, each with its category (``bench/kernels.PhaseKernels``, as ``bench --kernels``)."""
    phase = kernels.PhaseKernels()
    for name, us in events:
        phase.add(name, us)
    report = phase.report(top)
    return {"kernels": len(events), "gpu_us": report["us"], "categories": report["categories"], "top": report["top"]}


def _set_step_inputs(dec: StaticDecoder, p: int) -> None:
    """Plausible fixed inputs: a verify after ``p`` committed tokens, one new feature row."""
    dec.verify_pos[0].copy_(dec.offsets + p)
    dec.plain_pos.fill_(p)
    dec.num_new.fill_(1)
    dec.anchor_pos.fill_(p)


def bench_variant(target, drafter, opts: dict, args, prompt: torch.Tensor) -> dict:
    device = target.device
    dec = StaticDecoder(target, drafter, max_len=-(-(args.prompt_len + args.new_tokens + args.block_size + 1) // 64)
                        * 64, block_size=args.block_size, **opts)
    t0 = time.perf_counter()
    dec.speculative(prompt, args.new_tokens)  # captures / compiles verify and draft
    dec.plain(prompt, args.new_tokens)
    out = {"options": dict(opts), "setup_s": time.perf_counter() - t0}
    spec = dec.speculative(prompt, args.new_tokens)  # the decode_loop numbers: warm steps only
    plain = dec.plain(prompt, args.new_tokens)
    with torch.no_grad(), dec.patched():
        _set_step_inputs(dec, args.prompt_len)
        steps = {"plain": dec.plain_step, "verify": dec.verify_step, "draft": dec.draft_step}
        for name, step in steps.items():
            out[name] = time_step(step, args.replays, device)
        out["graphs"] = {n: bool(s.use_graph and s.graph is not None) for n, s in steps.items()}
        out["compiled"] = {n: s.compiled for n, s in steps.items()}
        out["kernels_uncompiled"] = {n: kernel_profile(s.eager_fn, device) for n, s in steps.items()}
        if any(s.compiled for s in steps.values()):
            out["kernels_compiled"] = {n: kernel_profile(s.fn, device) for n, s in steps.items()}
    plain_ms, verify_ms, draft_ms = (out[s]["median_ms"] for s in STEPS)
    out["verify_over_plain"] = verify_ms / plain_ms
    out["verify_plus_draft_over_plain"] = (verify_ms + draft_ms) / plain_ms
    out["break_even_tau"] = out["verify_plus_draft_over_plain"]  # tau above it: speculation is faster
    steps_run = max(1, len(spec.acceptance_lengths))
    out["decode_loop"] = {  # a real decode: host work and the per-step sync included
        "verify_steps": len(spec.acceptance_lengths),
        "draft_ms_per_step": 1e3 * spec.draft_time / steps_run,
        "verify_ms_per_step": 1e3 * spec.verify_time / steps_run,
        "plain_ms_per_token": 1e3 * plain.decode_time / max(1, len(plain.tokens) - 1),
        "same_tokens_as_plain": spec.tokens == plain.tokens,
    }
    return out


def main(argv=None) -> dict:
    """``python -m dflash_train.bench.decode_steps``: the report (also written to ``--out``)."""
    return run(parse_args(argv))


def command(args: argparse.Namespace) -> int:
    """The benchmark as a sub-command's ``func`` (exit status 0; the report goes to stdout and ``--out``)."""
    run(args)
    return 0


def run(args: argparse.Namespace) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32: the lossless check needs it
    torch.backends.cudnn.allow_tf32 = False
    names = args.variants.split(",") if args.variants else None
    unknown = [n for n in names or () if n not in VARIANTS]
    if unknown:  # before any model loads
        raise SystemExit(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
    target, drafter = load_pair(args)
    device = target.device
    names = names or (list(VARIANTS) if device.type == "cuda" else CPU_VARIANTS)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.facts.vocab_size - 1, (1, args.prompt_len), generator=gen).to(device)
    report = {"target": args.target, "drafter": args.drafter or f"random {args.drafter_kind}, {args.drafter_layers} layers",
              "dtype": args.dtype, "device": str(device), "block_size": args.block_size,
              "prompt_len": args.prompt_len, "replays": args.replays, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "variants": {}}
    start = time.perf_counter()
    for name in names:
        elapsed = time.perf_counter() - start
        if args.time_budget_s is not None and elapsed > args.time_budget_s:
            report["variants"][name] = {"error": f"skipped: time budget {args.time_budget_s:.0f}s spent"}
            continue
        print(f"[decode_steps] {name} ... ({elapsed:.0f}s)", flush=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                report["variants"][name] = bench_variant(target, drafter, dict(VARIANTS[name]), args, prompt)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            except Exception as err:  # noqa: BLE001 - one variant's failure must not hide the others
                report["variants"][name] = {"error": f"{type(err).__name__}: {err}",
                                            "traceback": traceback.format_exc()[-2000:]}
        report["variants"][name]["warnings"] = sorted({str(w.message)[:300] for w in caught})[:8]
        _write(report, args.out)
    _write(report, args.out)
    _summary(report)
    return report


def _write(report: dict, path: str | None) -> None:
    """Rewritten after every variant, atomically: a kill or a full disk leaves the last whole
    report (never a half-written one), and a failure is one line naming ``path``."""
    if path:
        atomic_write_text(path, json.dumps(report, indent=2), "decode-steps report", "free space or choose another --out")


def _summary(report: dict) -> None:
    print(json.dumps(report, indent=2))
    print(f"{'variant':26s} {'plain':>8s} {'verify':>8s} {'draft':>8s} {'v/p':>6s} {'tau*':>6s}  (median ms)")
    for name, v in report["variants"].items():
        if "error" in v:
            print(f"{name:26s} ERROR {v['error'][:80]}")
            continue
        print(f"{name:26s} {v['plain']['median_ms']:8.3f} {v['verify']['median_ms']:8.3f} "
              f"{v['draft']['median_ms']:8.3f} {v['verify_over_plain']:6.2f} {v['break_even_tau']:6.2f}")


if __name__ == "__main__":
    main()
