"""``dflash-train bench``: time training steps of one configuration, print one JSON object.

Reference configuration (H200): ``dflash-train bench --target-config qwen3-8b`` (a
random-weight Qwen3-8B-shaped target in bf16, 5-layer drafter, B=16, 512 anchors,
3072 tokens, flex attention, compiled drafter layers). See ``bench/run.py`` for what
is timed and how, and ``bench/flops.py`` for the FLOP model behind MFU.

Several GPUs (colocated, DDP drafter; ``context_tokens_per_s`` is the total):
``torchrun --nproc-per-node 2 -m dflash_train.cli bench --target-config qwen3-8b``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dflash_train.cli_types import comma_separated_ints, int_at_least, nonneg_int, positive_int
from dflash_train.files import atomic_write_text, explained
from dflash_train.models.kinds import kind_names
from dflash_train.objective.weighting import WEIGHTINGS


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark training steps on synthetic data (one JSON object on stdout)")
    p.add_argument("--target-config", default="qwen3-8b",
                   help="qwen3-8b (random Qwen3-8B-shaped target, the reference), tiny (CPU CI) or a HF model folder")
    p.add_argument("--drafter-layers", type=positive_int, default=5, help="drafter decoder layers")
    p.add_argument("--block-size", type=int_at_least(2), default=16, help="drafter block size (>= 2)")
    p.add_argument("--target-layer-ids", type=comma_separated_ints, default=None,
                   help="comma-separated, e.g. 1,9,17,25,33 (default: the spec's rule)")
    p.add_argument("--num-anchors", type=positive_int, default=None, help="default 512 (8 for tiny)")
    p.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sequence; default 3072 (128 for tiny)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="sequences per micro-batch (one micro-batch per step)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps")
    p.add_argument("--warmup", type=nonneg_int, default=3, help="untimed warm-up steps (the first carries compilation)")
    p.add_argument("--profile-steps", type=nonneg_int, default=None,
                   help="steps of the separate synchronized pass that times each phase (default min(steps, 3))")
    p.add_argument("--attention", choices=["flex", "sdpa", "auto"], default="auto",
                   help="drafter attention kernel (auto: flex on CUDA, sdpa otherwise)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the drafter layers and the loss chunks (default: on CUDA only)")
    p.add_argument("--loss-chunk-size", type=positive_int, default=4096,
                   help="positions per chunk of the vocabulary loss (objective.chunk_size)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--dtype", default="auto", help="target weights and autocast dtype (auto: bf16 on CUDA)")
    p.add_argument("--checkpoint-drafter", action="store_true",
                   help="activation checkpointing (non-reentrant) of every drafter layer")
    p.add_argument("--matmul-size", type=positive_int, default=None, help="matmul ceiling size (default 8192 CUDA, 1024 CPU)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the random weights and data")
    p.add_argument("--cuda-graph-step", action="store_true",
                   help="replay the step as one CUDA graph after the warm-up, as the trainer does "
                        "(train.cuda_graph_step; one process; needs --warmup >= 2 for a timed loop of replays)")
    p.add_argument("--optim", choices=["adamw", "muon"], default="adamw",
                   help="the optimizer of the timed step (optim.name; muon: train/muon.py)")
    p.add_argument("--drafter-kind", choices=kind_names(), default="dflash",
                   help="drafter.kind: a kind's network and training terms join the step (models/kinds/)")
    p.add_argument("--weighting", choices=list(WEIGHTINGS), default="decay",
                   help="objective.weighting: decay, reach or dpace (objective/weighting.py)")
    p.add_argument("--target-fp8", action="store_true",
                   help="the target's decoder-layer linears as FP8 matmuls with rowwise scales (target.fp8_linear; "
                        "CUDA 8.9+, an emulation on the CPU); recorded as config.target_fp8")
    p.add_argument("--compile-target", action="store_true",
                   help="torch.compile the target's decoder layers (target.compile): its norms, rotary, "
                        "activations (and FP8 quantization) fused; recorded as config.compile_target")
    p.add_argument("--drafter-fp8", action="store_true",
                   help="the drafter layers' attention and MLP projections with FP8 forward and backward GEMMs "
                        "(train.fp8_drafter; CUDA 8.9+, an emulation on the CPU); recorded as config.drafter_fp8")
    p.add_argument("--kernels", type=nonneg_int, default=0,
                   help="N > 0: one more step under torch.profiler; each phase's device time by kernel category "
                        "and its top N kernels, as the JSON's 'kernels' (bench/kernels.py)")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    p.set_defaults(func=run_cli)


def run_cli(args) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from dflash_train.bench.run import BenchConfig, run_bench

    cfg = BenchConfig(
        target_config=args.target_config, drafter_layers=args.drafter_layers, block_size=args.block_size,
        target_layer_ids=args.target_layer_ids, num_anchors=args.num_anchors, seq_len=args.seq_len,
        batch_size=args.batch_size, steps=args.steps, warmup=args.warmup, profile_steps=args.profile_steps,
        attention=args.attention, compile=args.compile, loss_chunk_size=args.loss_chunk_size, device=args.device,
        dtype=args.dtype, checkpoint_drafter=args.checkpoint_drafter, matmul_size=args.matmul_size, seed=args.seed,
        cuda_graph_step=args.cuda_graph_step, optim=args.optim, target_fp8=args.target_fp8,
        drafter_fp8=args.drafter_fp8, compile_target=args.compile_target, drafter_kind=args.drafter_kind, weighting=args.weighting,
        kernels=args.kernels,
    )
    result = run_bench(cfg)
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
