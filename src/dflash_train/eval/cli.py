"""``dflash-train eval``: tau, speed and the lossless check of a serving-format drafter."""

from __future__ import annotations

import argparse
import sys

DTYPES = ("auto", "float32", "bfloat16", "float16")


def register(subparsers) -> None:
    from dflash_train.cli_types import (
        nonnegative_float,
        nonnegative_int,
        positive_float,
        positive_int,
        probability,
    )
    from dflash_train.decoding.skinny import LINEAR_MODES

    p = subparsers.add_parser(
        "eval",
        help="measure acceptance length (tau) and speedup of a DFlash drafter",
        description="Speculative decoding with a DFlash drafter folder against plain target decoding: "
        "mean tau, tau per prompt, accepted-length histogram, per-position acceptance, tokens/s, speedup, "
        "and (greedy) a token-for-token lossless check. Exits 1 when the lossless check fails.",
    )
    p.add_argument("--target", required=True, help="target model folder (or folder/file.gguf)")
    p.add_argument("--drafter", required=True, help="DFlash serving-format folder (config.json + model.safetensors)")
    p.add_argument("--prompts", required=True,
                   help="chat .jsonl/.json (messages / conversations / prompt), a text file (one prompt per line), "
                        "or a packaged set: heldout (reports), selection (choosing ablations)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="new tokens per prompt")
    p.add_argument("--block-size", type=positive_int, default=None, help="default: the drafter's; may be smaller")
    p.add_argument("--temperature", type=nonnegative_float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=probability, default=None, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N prompts (N >= 1)")
    p.add_argument("--no-lossless-check", action="store_true", help="skip the greedy token-for-token check")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip plain target decoding (no speedup, no lossless check)")
    p.add_argument("--engine", choices=("auto", "hf", "static", "llama.cpp", "vllm"), default="auto",
                   help="hf: reference loops over the Hugging Face cache (any temperature); static: "
                        "preallocated caches + CUDA graphs (greedy only; same tokens and tau, ~6-9x faster "
                        "on an H200 for SmolLM2); auto (default): static when greedy, else hf; llama.cpp: "
                        "decode with llama.cpp (greedy, CPU) beside our reference loop, per-step acceptance "
                        "aligned (see --llama-cpp); vllm: decode with the pinned vLLM (greedy, CPU, its own environment: "
                        "`dflash-train vllm install`) beside our reference loop, per-step acceptance aligned")
    p.add_argument("--llama-cpp", default=None, metavar="BUILD_DIR",
                   help="--engine llama.cpp: the llama.cpp build folder (default: $DFLASH_LLAMA_CPP, else the "
                        "cached build of `dflash-train llama-cpp build`)")
    p.add_argument("--target-gguf", default=None,
                   help="--engine llama.cpp: the target as GGUF (default: converted once by llama.cpp's own "
                        "converter into OUT/target-f32.gguf)")
    p.add_argument("--drafter-gguf", default=None,
                   help="--engine llama.cpp: the drafter as GGUF (default: DRAFTER/drafter.gguf when export "
                        "wrote it, else written into OUT/drafter.gguf)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="--engine llama.cpp: threads per llama.cpp program (default 1: ggml's threads spin, "
                        "so on a shared machine one is often fastest)")
    p.add_argument("--request-timeout", type=positive_float, default=600.0, metavar="SECONDS",
                   help="--engine llama.cpp / vllm: seconds the engine may take to answer one request (a llama.cpp "
                        "program run; vLLM: its start, then each request); past it the engine's processes are "
                        "stopped and the command ends in one line with its log's last lines (default 600)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="static engine: torch.compile the steps of --compile-steps before CUDA-graph capture "
                        "(default: on with CUDA, off on CPU); a compile failure warns and keeps the uncompiled step")
    p.add_argument("--compile-mode", choices=("default", "max-autotune-no-cudagraphs"), default="default",
                   help="inductor mode when compiling (max-autotune-no-cudagraphs: autotuned GEMMs, "
                        "minutes of compilation)")
    p.add_argument("--compile-steps", default="draft",
                   help="static engine, with --compile: the steps to compile, a comma list of plain, verify, draft "
                        "(default draft: the drafter's step alone, so the target runs the same uncompiled kernels "
                        "in the baseline and in verification)")
    p.add_argument("--linear", choices=("auto", *LINEAR_MODES), default="auto",
                   help="static engine: how few-row float32 matmuls (verify, draft) run; see decoding/skinny.py "
                        "(auto: splitk for float32 on CUDA, cuBLAS as is otherwise)")
    p.add_argument("--fuse-projections", action=argparse.BooleanOptionalAction, default=None,
                   help="static engine: one GEMM for q/k/v and one for gate/up in every target layer "
                        "(default: on with CUDA)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the sampling (temperature > 0)")
    p.add_argument("--out", default="eval_results", help="folder for eval.json and eval.png")
    p.set_defaults(func=run)


def _compile_option(flag: bool | None, mode: str, device: str) -> bool | str:
    """``--compile/--no-compile`` (unset: on with CUDA) -> False or the inductor mode."""
    on = flag if flag is not None else device.startswith("cuda")
    return mode if on else False


def _compile_steps(text: str) -> tuple[str, ...]:
    """``--compile-steps`` -> a tuple of step names (listed here: importing decoding.static, which
    holds them, would import torch before arguments are parsed)."""
    steps = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in steps if s not in ("plain", "verify", "draft")]
    if bad or not steps:
        raise ValueError(f"--compile-steps: expected a comma list of plain, verify, draft, got {text!r}")
    return steps


def run(args: argparse.Namespace) -> int:
    if args.engine in ("llama.cpp", "vllm"):
        return _run_engine(args)
    import torch

    from dflash_train.devices import resolve_device
    from dflash_train.eval.evaluate import EvalOptions, evaluate, format_table, write_report
    from dflash_train.eval.loader import load_eval_inputs

    device = str(resolve_device(args.device, "--device"))
    dtype_name = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name)

    target, drafter, ids = load_eval_inputs(args.target, args.drafter, args.prompts, args.limit, device, dtype)
    baseline = not args.no_baseline
    check = baseline and args.temperature == 0 and not args.no_lossless_check
    print(f"eval: {len(ids)} prompts, target {args.target} ({dtype_name}, {device}), drafter {args.drafter}, "
          f"block {args.block_size or drafter.block_size}, T={args.temperature}", file=sys.stderr)
    options = EvalOptions(max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                          temperature=args.temperature, top_p=args.top_p, baseline=baseline, lossless_check=check,
                          seed=args.seed, progress=True, engine=args.engine,
                          compile=_compile_option(args.compile, args.compile_mode, device), linear=args.linear,
                          fuse_projections=args.fuse_projections, compile_steps=_compile_steps(args.compile_steps))
    report = evaluate(target, drafter, ids, options)
    report["target"], report["drafter"], report["prompts_file"] = str(args.target), str(args.drafter), str(args.prompts)
    json_path, png_path = write_report(report, args.out)
    print(format_table(report))
    print(f"wrote {json_path} and {png_path}")
    lossless = report["lossless"]
    if lossless["checked"] and not lossless["ok"]:
        for i in lossless["failed_prompts"]:
            print(f"LOSSLESS CHECK FAILED on prompt {i}: {lossless['per_prompt'][i]}", file=sys.stderr)
        return 1
    return 0


def _run_engine(args: argparse.Namespace) -> int:
    """``--engine llama.cpp`` / ``vllm`` decode greedily in float32 on the CPU beside our reference: refuse
    what they cannot do."""
    if args.temperature > 0:
        raise ValueError(f"--engine {args.engine}: greedy only (--temperature 0)")
    if args.dtype not in ("auto", "float32") or (args.device or "cpu") != "cpu":
        raise ValueError(f"--engine {args.engine}: the reference decodes in float32 on the CPU (--dtype float32)")
    if args.engine == "vllm":
        from dflash_train.eval.vllm import run_cli
    else:
        from dflash_train.eval.llamacpp import run_cli
    return run_cli(args)
