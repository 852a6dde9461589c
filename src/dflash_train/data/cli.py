"""Sub-commands ``regenerate`` and ``data inspect``; ``register`` is called by the top-level CLI.

``python -m dflash_train.data.cli ...`` runs them without the other modules' commands.
"""

from __future__ import annotations

import argparse
import sys

from dflash_train.cli_types import float_in, fraction, nonneg_float, nonneg_int, positive_int


def register(subparsers) -> None:
    regen = subparsers.add_parser("regenerate", help="replace assistant turns with the target's own responses")
    regen.add_argument("--target", required=True, help="HF model folder of the target")
    regen.add_argument("--data", required=True, nargs="+", help="input files or folders")
    regen.add_argument("--out", required=True, help="output JSONL (appended to; resumable)")
    regen.add_argument("--max-new-tokens", type=positive_int, default=1024, help="longest answer per record")
    regen.add_argument("--temperature", type=nonneg_float, default=0.0, help="0 = greedy")
    regen.add_argument("--top-p", type=fraction, default=1.0, help="nucleus sampling mass in (0, 1]")
    regen.add_argument("--batch-size", type=positive_int, default=8, help="records generated together")
    regen.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=None,
                       help="pass enable_thinking to the chat template (default: template default)")
    regen.add_argument("--limit", type=positive_int, default=None, help="only the first N valid input records")
    regen.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), bfloat16, float32")
    regen.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    regen.add_argument("--strict", action="store_true", help="stop at the first bad record")
    regen.add_argument("--seed", type=nonneg_int, default=0, help="seed of the sampling (temperature > 0)")
    regen.add_argument("--backend", choices=["hf", "static"], default="hf",
                       help="hf: transformers generate; static: fast static-cache batched decoding (decoding/batched.py)")
    regen.add_argument("--max-batch", type=positive_int, default=1024, help="static backend: rows per decode bucket")
    regen.add_argument("--gen-mode", choices=["auto", "eager", "cudagraph", "compile"], default="auto",
                       help="static backend: decode step on CUDA (auto = cudagraph; CPU is always eager)")
    regen.add_argument("--compact", action="store_true",
                       help="static backend: once at most half of a bucket's rows still run, continue them at a "
                            "smaller batch (same answers; decoding/batched.py)")
    regen.add_argument("--keep-eval-prompts", action="store_true",
                       help="also answer records that ask an evaluation prompt (heldout, selection, --exclude-prompts);"
                            " by default they are skipped and counted, so no answer to one reaches training data")
    regen.add_argument("--exclude-prompts", nargs="+", default=[], metavar="SET_OR_FILE",
                       help="more prompt sets or files whose prompts no record may ask (e.g. your eval prompts)")
    regen.set_defaults(func=cmd_regenerate)

    data = subparsers.add_parser("data", help="data tools (inspect: what training will see)")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    insp = data_sub.add_parser("inspect", help="show a tokenized example and dataset statistics")
    insp.add_argument("--data", required=True, nargs="+", help="chat/text files or folders, as data.paths")
    insp.add_argument("--tokenizer", required=True, help="the target model folder (its tokenizer and chat template)")
    insp.add_argument("--index", type=nonneg_int, default=0, help="which kept example to show, 0-based")
    insp.add_argument("--max-length", type=positive_int, default=2048, help="tokens per example (data.max_length)")
    insp.add_argument("--supervise", choices=["all", "last"], default="all",
                      help="train on every assistant turn or only the last (data.supervise)")
    insp.add_argument("--no-reasoning", action="store_true", help="drop <think> content")
    insp.add_argument("--block-size", type=positive_int, default=16,
                      help="the drafter's block size (sets the default --min-supervised-tokens)")
    insp.add_argument("--min-supervised-tokens", type=nonneg_int, default=None,
                      help="skip examples with fewer answer tokens (default 2 x --block-size; data.min_supervised_tokens)")
    insp.add_argument("--cache-dir", default=None, help="tokenized-data cache folder (data.cache_dir)")
    insp.add_argument("--strict", action="store_true", help="stop at the first bad record instead of skipping it")
    insp.add_argument("--trim-loops", action="store_true",
                      help="cut answers ending in a repetition loop to two periods (data.trim_loops)")
    insp.add_argument("--max-lookup-tau", type=float_in(1.0), default=None,
                      help="skip answers that prompt lookup drafts at more than this many tokens per step "
                           "(data.max_lookup_tau)")
    insp.add_argument("--chat-template", default=None,
                      help="a Jinja template string or a .jinja file to format chats with (data.chat_template)")
    insp.add_argument("--keep-eval-prompts", action="store_true",
                      help="keep records that ask an evaluation prompt (data.exclude_eval_prompts=false)")
    insp.add_argument("--color", action=argparse.BooleanOptionalAction, default=None,
                      help="color supervised tokens (default: when stdout is a terminal)")
    insp.set_defaults(func=cmd_inspect)


def _check_positive(**values) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")


def cmd_regenerate(args) -> int:
    from pathlib import Path

    import torch

    from dflash_train.decoding.generators import HFGenerator, SamplingParams

    from .decontaminate import drop_eval_prompts, evaluation_prompts
    from .errors import SkipReport
    from .readers import read_records, resolve_files
    from .regenerate import run_regenerate

    _check_positive(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, limit=args.limit)
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise ValueError("--temperature must be >= 0 and --top-p in (0, 1]")
    if not Path(args.target).exists():
        raise FileNotFoundError(f"--target {args.target}: no such model folder")
    resolve_files(args.data)  # fail fast on missing input before loading the model
    excluded = None if args.keep_eval_prompts else evaluation_prompts(args.exclude_prompts)
    torch.manual_seed(args.seed)
    if getattr(args, "backend", "hf") == "static":
        from dflash_train.decoding.batched import StaticCacheGenerator

        generator = StaticCacheGenerator(args.target, dtype=args.dtype, device=args.device,
                                         max_batch=args.max_batch, mode=args.gen_mode, compact=args.compact)
    else:
        generator = HFGenerator(args.target, dtype=args.dtype, device=args.device)
    params = SamplingParams(args.max_new_tokens, args.temperature, args.top_p, args.thinking)
    report = SkipReport()
    records = read_records(args.data, report, args.strict)
    if excluded is not None:
        records = drop_eval_prompts(records, excluded, report)
    summary = run_regenerate(records, generator, Path(args.out), params, args.batch_size, report,
                             args.limit, args.strict)
    print(summary.format(report))
    stats = getattr(generator, "stats", None)
    if stats is not None:
        print(f"static backend: {stats.new_tokens} new tokens in {stats.seconds:.1f}s generate time "
              f"({stats.tokens_per_s:.0f} tok/s; prefill {stats.prefill_seconds:.1f}s, {stats.buckets} buckets, "
              f"mode={generator.mode}; {stats.row_steps} row-steps, {stats.compactions} compactions)")
    return 0


def load_tokenizer(path: str):
    """A local tokenizer folder (nothing downloads: HF_HUB_OFFLINE); one clear line otherwise."""
    from pathlib import Path

    from transformers import AutoTokenizer

    if not Path(path).expanduser().exists():
        raise FileNotFoundError(f"--tokenizer {path}: no such folder (a model or tokenizer folder)")
    try:
        return AutoTokenizer.from_pretrained(Path(path).expanduser())
    except (OSError, ValueError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ValueError(f"--tokenizer {path}: cannot load a tokenizer from it ({first.strip()})") from None


def cmd_inspect(args) -> int:
    from . import DataConfig, load_tokenized
    from .inspect import inspect_dataset

    tokenizer = load_tokenizer(args.tokenizer)
    cfg = DataConfig(paths=args.data, max_length=args.max_length, supervise=args.supervise,
                     keep_reasoning=not args.no_reasoning, min_supervised_tokens=args.min_supervised_tokens,
                     strict=args.strict, cache_dir=args.cache_dir, token_budget=max(8192, args.max_length),
                     trim_loops=args.trim_loops, max_lookup_tau=args.max_lookup_tau,
                     chat_template=args.chat_template, exclude_eval_prompts=not args.keep_eval_prompts)
    dataset, report = load_tokenized(cfg, tokenizer, args.block_size)
    color = sys.stdout.isatty() if args.color is None else args.color
    print(inspect_dataset(dataset, report, tokenizer, args.index, color))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dflash-train")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"dflash-train {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
