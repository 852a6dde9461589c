"""``dflash-train bench``: time training steps of one job config, print one JSON object.

    dflash-train bench RECIPE_OR_FILE [section.key=value ...] [--target-config SHAPE] [--steps N] ...

The step is the one ``dflash-train train RECIPE_OR_FILE [overrides]`` would run (``bench/job.py``);
the flags say what a job has no key for: a synthetic target shape, the rows, the clock. Reference
configuration (H200): ``dflash-train bench qwen3-8b train.cuda_graph_step=false --target-config
qwen3-8b`` (a random-weight Qwen3-8B-shaped target in bf16, the recipe's 5-layer B = 16 drafter, 512
anchors, 3,072-token rows, flex attention, compiled drafter layers, the eager step). See
``bench/run.py`` for what is timed and how, and ``bench/flops.py`` for the FLOP model behind MFU.

Several GPUs (colocated, DDP drafter; ``context_tokens_per_s`` is the total):
``torchrun --nproc-per-node 2 -m dflash_train.cli bench qwen3-8b --target-config qwen3-8b``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dflash_train.cli_types import comma_separated_ints, int_at_least, nonneg_int, positive_int
from dflash_train.config import recipe_names
from dflash_train.files import atomic_write_text, explained

# The flags the bench had before it read a job config, each now an alias of the override it names
# (so the command lines quoted in docs/results run unchanged): flag -> (key, argparse type).
ALIASES = {
    "--drafter-layers": ("drafter.num_hidden_layers", positive_int),
    "--block-size": ("drafter.block_size", int_at_least(2)),
    "--target-layer-ids": ("drafter.target_layer_ids", comma_separated_ints),
    "--drafter-kind": ("drafter.kind", str),
    "--num-anchors": ("train.num_anchors", positive_int),
    "--attention": ("train.attention", str),
    "--seed": ("train.seed", nonneg_int),
    "--loss-chunk-size": ("objective.chunk_size", positive_int),
    "--weighting": ("objective.weighting", str),
    "--optim": ("optim.name", str),
    "--dtype": ("target.dtype", str),
}
# ... and the switches among them: flag -> the key they set to true
SWITCHES = {
    "--checkpoint-drafter": "train.activation_checkpointing",
    "--cuda-graph-step": "train.cuda_graph_step",
    "--drafter-fp8": "train.fp8_drafter",
    "--target-fp8": "target.fp8_linear",
    "--compile-target": "target.compile",
}


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark training steps on synthetic data (one JSON object on stdout)",
                       description="Time the training step of a job config (a recipe or a file, then section.key=value "
                                   "overrides, as dflash-train train takes them; both before the flags) on synthetic "
                                   "rows.")
    p.add_argument("config", nargs="?", default=None,
                   help=f"a YAML/JSON config file or a recipe: {', '.join(recipe_names())} (none: the package "
                        "defaults on the qwen3-8b shape, 3072-token rows, train.cuda_graph_step=false)")
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. objective.weighting=dpace drafter.kind=dspark")
    p.add_argument("--target-config", default=None,
                   help="the target: qwen3-8b, qwen3-30b-a3b (random weights of that shape, no download), tiny, "
                        "tiny-moe (CPU tests) or a HF model folder; written as target.path (default: the job's)")
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help="tokens per synthetic row (default: data.max_length; 128 on a tiny shape)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="rows per micro-batch (train.grad_accum micro-batches per step)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps")
    p.add_argument("--warmup", type=nonneg_int, default=3, help="untimed warm-up steps (the first carries compilation)")
    p.add_argument("--profile-steps", type=nonneg_int, default=None,
                   help="steps of the separate synchronized pass that times each phase (default min(steps, 3))")
    p.add_argument("--matmul-size", type=positive_int, default=None, help="matmul ceiling size (default 8192 CUDA, 1024 CPU)")
    p.add_argument("--kernels", type=nonneg_int, default=0,
                   help="N > 0: one more step under torch.profiler; each phase's device time by kernel category "
                        "and its top N kernels, as the JSON's 'kernels' (bench/kernels.py)")
    p.add_argument("--device", default=None, help="auto, cuda, cuda:N or cpu (default: train.device)")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    _add_aliases(p)
    p.set_defaults(func=run_cli)


def _add_aliases(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("older flags", "each writes the override it names (prefer the override)")
    for flag, (key, kind) in ALIASES.items():
        group.add_argument(flag, type=kind, default=None, dest=_dest(flag), metavar="VALUE", help=f"{key}=VALUE")
    for flag, key in SWITCHES.items():
        group.add_argument(flag, action="store_true", default=None, dest=_dest(flag), help=f"{key}=true")
    group.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, dest="alias_compile",
                       help="train.compile=true (--no-compile: false)")


def _dest(flag: str) -> str:
    return "alias_" + flag.removeprefix("--").replace("-", "_")


def alias_overrides(args) -> list[str]:
    """The overrides the older flags given on the command line stand for (JSON values are YAML)."""
    keys = {**{flag: key for flag, (key, _) in ALIASES.items()}, **SWITCHES, "--compile": "train.compile"}
    given = {key: getattr(args, _dest(flag)) for flag, key in keys.items()}
    return [f"{key}={json.dumps(value)}" for key, value in given.items() if value is not None]


def job_words(args) -> tuple[str | None, list[str]]:
    """(recipe or file, overrides): a first word holding ``=`` that names no file is an override."""
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).exists():
        config, overrides = None, [config, *overrides]
    return config, [*alias_overrides(args), *overrides]


def run_cli(args) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from dflash_train.bench.job import BenchOptions, bench_job
    from dflash_train.bench.run import run_bench

    config, overrides = job_words(args)
    job = bench_job(config, overrides, args.target_config)
    opts = BenchOptions(seq_len=args.seq_len, batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                        profile_steps=args.profile_steps, matmul_size=args.matmul_size, kernels=args.kernels,
                        device=args.device)
    result = run_bench(job, opts)
    if result["rank"] != 0:  # under torchrun only rank 0 reports
        return 0
    text = json.dumps(result, indent=1)
    if args.out:
        write_result(text, Path(args.out))
    print(text, flush=True)
    return 0


OUT_TODO = "free space or choose another --out"


def write_result(text: str, out: Path) -> None:
    """The JSON object to ``--out``, atomically: a failure is one line naming it, no half file."""
    with explained("cannot write the bench result's folder", out.parent, OUT_TODO):
        out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text + "\n", "bench result", OUT_TODO)
