"""Online training, the in-memory feature cache and feature stores, side by side on one job; prints JSON.

    python scripts/feature_store_bench.py RECIPE [section.key=value ...] --out DIR [--epochs 2]
        [--modes online,cache,store-auto,store-bfloat16,store-float8,hybrid] [--tau-prompts N]

For each store encoding: ``dflash-train features`` (dump tokens/s, bytes per token). For each mode: the
same job trained for ``--epochs`` epochs in its own run folder, then (``--tau-prompts N``) exported and
evaluated on N held-out prompts. ``hybrid``: ``train.feature_cache=disk``, its first epoch writing
``store-hybrid``. Per mode: context tokens/s (median of the log windows, per epoch; the
first window is left out: compilation, warm-up), the logged losses and their largest relative distance
from online training's at the same steps, the store's read bandwidth and the seconds the step waited on
it, and held-out tau. Every mode trains the same steps on the same data with the same seed.

The README's CPU rows: ``cpu-demo`` with ``data.paths=[chat.jsonl] data.max_examples=...``; the GPU
rows: ``smollm2-1gpu`` (see README "Train from a feature store").
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("online", "cache", "store-auto", "store-bfloat16", "store-float8", "hybrid")


def run_overrides(mode: str, out: Path, epochs: float) -> list[str]:
    """The overrides that make ``mode`` of the job, in its own run folder."""
    common = [f"train.run_dir={out / ('run-' + mode)}", f"train.epochs={epochs}", "train.max_steps=null",
              "eval.prompts=null", "train.progress=false", "train.log_every=5", "train.resume=null"]
    if mode == "cache":
        return [*common, "train.feature_cache=device"]
    if mode == "hybrid":  # the first epoch online writes store-hybrid, the later ones read it
        return [*common, "train.feature_cache=disk", f"train.feature_store={out / 'store-hybrid'}"]
    common.append("train.feature_cache=off")  # a recipe's own cache (smollm2-1gpu) off: online is online
    if mode.startswith("store-"):
        return [*common, f"train.feature_store={out / mode}"]
    return common


def dump_store(recipe: str, overrides: list[str], out: Path, kind: str) -> dict:
    from dflash_train.config import load_config
    from dflash_train.distributed.feature_job import dump

    cfg = load_config(recipe, overrides)
    started = time.perf_counter()
    manifest = dump(cfg, out / f"store-{kind}", kind, echo=lambda line: print(line, file=sys.stderr))
    seconds = time.perf_counter() - started
    return {"dump_seconds": round(seconds, 2), "dump_tokens_per_s": manifest.get("dump_tokens_per_s_rank0"),
            "bytes_per_token": round(manifest["bytes"] / manifest["tokens"], 1), "store_bytes": manifest["bytes"],
            "tokens": manifest["tokens"]}


def train_mode(recipe: str, overrides: list[str]) -> tuple[dict, list[dict]]:
    from dflash_train.config import load_config
    from dflash_train.train.loop import train

    cfg = load_config(recipe, overrides)
    summary = train(cfg, echo=lambda line: print(line, file=sys.stderr))
    rows = [json.loads(line) for line in (Path(cfg.train.run_dir) / "metrics.jsonl").read_text().splitlines()]
    return summary, [r for r in rows if "loss" in r]


def speed_by_epoch(records: list[dict]) -> dict[str, float]:
    by_epoch: dict[int, list[float]] = {}
    for record in records[1:]:
        by_epoch.setdefault(int(record.get("epoch", 0)), []).append(record["tokens_per_s"])
    return {f"epoch{e}": round(statistics.median(v), 1) for e, v in sorted(by_epoch.items())}


def held_out_tau(recipe: str, overrides: list[str], run_dir: Path, prompts: int) -> float | None:
    from dflash_train.config import load_config

    cfg = load_config(recipe, overrides)
    export, evaluation = run_dir / "drafter", run_dir / "eval"
    cli = [sys.executable, "-m", "dflash_train.cli"]
    subprocess.run([*cli, "export", str(run_dir), str(export), "--target", cfg.target.path], check=True,
                   stdout=sys.stderr)
    subprocess.run([*cli, "eval", "--target", cfg.target.path, "--drafter", str(export), "--prompts", "heldout",
                    "--limit", str(prompts), "--out", str(evaluation)], check=True, stdout=sys.stderr)
    return json.loads((evaluation / "eval.json").read_text()).get("mean_tau")


def source_timing(recipe: str, overrides: list[str], out: Path, kinds: list[str], count: int, rounds: int = 3) -> dict:
    """Seconds to produce one micro-batch's features, per source: the target's forward ("online") and each
    store's read + decode, on the first ``count`` micro-batches of the first epoch, the sources taking turns
    micro-batch by micro-batch (a machine whose load drifts slows them alike); medians, and context
    tokens/s of the features alone."""
    import torch

    from dflash_train.config import load_config
    from dflash_train.devices import resolve_device
    from dflash_train.features.reader import FeatureStore, StoreFeatures
    from dflash_train.train.assembly import load_data, load_target, resolve_drafter, target_dtype
    from dflash_train.train.features import target_features

    cfg = load_config(recipe, overrides)
    device = resolve_device(cfg.train.device)
    dtype = target_dtype(cfg, device)
    target = load_target(cfg.target, device, dtype)
    layer_ids = resolve_drafter(cfg.drafter, target).target_layer_ids
    data = load_data(cfg, target.tokenizer, cfg.drafter.block_size)
    iterator = data.batches(0, 1, 1)
    mbs = [iterator.collate(ids, 0) for ids in data.plan.epoch_micro_batches(0)[:count]]
    sources = {"online": lambda mb: target_features(target, layer_ids, False, mb, mb.input_ids.to(device),
                                                    mb.attention_mask.to(device))}
    for kind in kinds:
        store = StoreFeatures(None, FeatureStore(out / f"store-{kind}"), device, dtype, False)
        sources[f"store-{kind}"] = lambda mb, store=store: store.features(mb, mb.input_ids.to(device), None)
    seconds: dict[str, list[float]] = {name: [] for name in sources}
    for _ in range(rounds):
        for mb in mbs:
            for name, source in sources.items():
                started = time.perf_counter()
                source(mb)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds[name].append(time.perf_counter() - started)
    tokens = statistics.mean(int(mb.attention_mask.sum()) for mb in mbs)
    return {name: {"median_s_per_micro_batch": round(statistics.median(v), 5),
                   "tokens_per_s": round(tokens / statistics.median(v), 1)} for name, v in seconds.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--tau-prompts", type=int, default=0)
    parser.add_argument("--source-timing", type=int, default=0, metavar="N",
                        help="also time the feature sources alone on N micro-batches (after the modes' stores exist)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    result: dict = {"recipe": args.recipe, "overrides": args.overrides, "epochs": args.epochs, "modes": {}}
    baseline = None
    for mode in modes:
        row: dict = {}
        if mode == "hybrid":  # a store left by an earlier bench would be read from the first step
            shutil.rmtree(args.out / "store-hybrid", ignore_errors=True)
        if mode.startswith("store-"):
            row.update(dump_store(args.recipe, args.overrides, args.out, mode.removeprefix("store-")))
        overrides = [*args.overrides, *run_overrides(mode, args.out, args.epochs)]
        summary, records = train_mode(args.recipe, overrides)
        losses = [r["loss"] for r in records]
        row.update(steps=summary["steps"], tokens_per_s=speed_by_epoch(records), last_loss=losses[-1],
                   last_expected_acceptance=summary.get("last_expected_acceptance"))
        row.update({key: summary[key] for key in ("feature_store", "feature_cache") if key in summary})
        if mode == "hybrid":  # the store its first epoch wrote
            manifest = json.loads((args.out / "store-hybrid" / "manifest.json").read_text())
            row["bytes_per_token"] = round(manifest["bytes"] / manifest["tokens"], 1)
        if baseline is None:
            baseline = losses
        else:
            row["losses_equal_to_first_mode"] = losses == baseline
            row["max_rel_loss_diff_to_first_mode"] = max(abs(a - b) / abs(b) for a, b in zip(losses, baseline))
        if args.tau_prompts:
            row["tau"] = held_out_tau(args.recipe, overrides, args.out / f"run-{mode}", args.tau_prompts)
        result["modes"][mode] = row
        print(json.dumps({mode: row}), file=sys.stderr)
    if args.source_timing:
        kinds = [m.removeprefix("store-") for m in MODES if m.startswith("store-") and (args.out / m).exists()]
        kinds += ["hybrid"] if (args.out / "store-hybrid").exists() else []
        result["source_timing"] = source_timing(args.recipe, args.overrides, args.out, kinds, args.source_timing)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
