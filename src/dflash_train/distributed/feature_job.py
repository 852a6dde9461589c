"""``dflash-train features``: write a job's feature store (one process, or every rank under torchrun).

The job runs the target once over the job's data set (``train/assembly.py`` loads it,
``train/features.py`` computes the features) and writes what ``features/writer.py`` lays out; it sits
here, above ``train/``, with the other torchrun jobs (``launch.py``). The target's modules are imported
when the job runs, not when the command line is built.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from dflash_train.cli_types import float_in
from dflash_train.config import job_from_args, recipe_names
from dflash_train.features import format as fmt
from dflash_train.features.writer import (
    TODO,
    Index,
    ShardWriter,
    StoreLock,
    check_space,
    clean_rank,
    finish,
    my_micro_batches,
    open_manifest,
    store_job,
    write_missing,
)
from dflash_train.files import explained


def register(sub) -> None:
    p = sub.add_parser("features", help="run the target once and write a feature store to train from",
                       description="Write the feature store of a training job: the target's context features of its\n"
                                   "data set, on disk (docs/spec.md section 6). Then train from it with\n"
                                   "train.feature_store=STORE (no target forward). Resumable: rerun the same\n"
                                   "command after a stop. Under torchrun every rank writes its own shards.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help=f"the training job: a YAML/JSON config file or a recipe ({', '.join(recipe_names())})")
    p.add_argument("overrides", nargs="*", help="section.key=value, as for dflash-train train")
    p.add_argument("--out", required=True, help="the store's folder")
    p.add_argument("--dtype", default="auto", choices=fmt.DTYPES,
                   help="auto: the target's dtype (exactly what online training reads); bfloat16; float8: e4m3 with "
                        "a float32 scale per token and layer (about half of bfloat16)")
    p.add_argument("--shard-mib", type=float_in(0.0, low_open=True), default=256.0, help="bytes per shard file, in MiB (default 256)")
    p.add_argument("--verify", action="store_true",
                   help="rehash every shard already written and rewrite those that changed")
    p.set_defaults(func=run_features)


def run_features(args) -> int:
    import torch.distributed as dist

    from dflash_train.distributed.env import init_from_env, launched_by_torchrun, shutdown

    cfg = job_from_args(args)
    env = init_from_env(cfg.train.device) if launched_by_torchrun() else None
    rank, world = (env.rank, env.world) if env is not None else (0, 1)
    echo = print if rank == 0 else (lambda *a, **k: None)
    barrier = dist.barrier if world > 1 else (lambda: None)
    try:
        dump(cfg, args.out, args.dtype, rank=rank, world=world, barrier=barrier, echo=echo,
             shard_mib=args.shard_mib, verify=args.verify)
    finally:
        if env is not None:
            shutdown(clean=False)
    return 0


def dump(cfg, out, kind: str = "auto", target=None, rank: int = 0, world: int = 1, barrier: Callable = lambda: None,
         echo=print, shard_mib: float = 256.0, verify: bool = False) -> dict:
    """Write (or complete) the feature store of job ``cfg`` at ``out``; returns its manifest."""
    if kind not in fmt.DTYPES:
        raise ValueError(f"features --dtype must be one of {', '.join(fmt.DTYPES)}, got {kind!r}")
    folder = Path(out)
    with explained("cannot write feature store", folder, TODO):
        folder.mkdir(parents=True, exist_ok=True)
    lock = StoreLock(folder, echo) if rank == 0 else None  # the main rank holds it, as in training
    if lock is not None:
        lock.acquire()
    try:
        return _dump(cfg, folder, kind, target, rank, world, barrier, echo, shard_mib, verify)
    finally:
        if lock is not None:
            lock.release()


def _dump(cfg, folder: Path, kind, target, rank, world, barrier, echo, shard_mib, verify) -> dict:
    from dflash_train.devices import resolve_device
    from dflash_train.train.assembly import load_data, load_target, resolve_drafter, target_dtype

    device = resolve_device(cfg.train.device)
    dtype = target_dtype(cfg, device)
    target = target or load_target(cfg.target, device, dtype)
    drafter_cfg = resolve_drafter(cfg.drafter, target, echo)
    data = load_data(cfg, target.tokenizer, drafter_cfg.block_size)
    fingerprint, encoding = store_job(cfg, target, drafter_cfg, data.dataset, dtype, kind, world)
    manifest = open_manifest(folder, fingerprint, encoding, rank == 0)
    if manifest["state"] == "complete" and not verify:
        echo(f"feature store {folder} is complete already ({manifest['tokens']:,} tokens)")
        return manifest
    barrier()
    index = Index.read(folder / fmt.index_name(rank))
    clean_rank(folder, rank, index, verify, echo)
    plan = data.plan.epoch_micro_batches(0)
    todo = [i for i in my_micro_batches(len(plan), rank, world, cfg.train.grad_accum) if i not in index.done()]
    lengths = data.dataset["length"]
    remaining = sum(lengths[s] for i in todo for s in _samples(plan[i]))
    check_space(folder, remaining * encoding["bytes_per_token"], echo)
    writer = ShardWriter(folder, rank, index, int(shard_mib * 2**20))
    started = time.perf_counter()
    tokens = write_missing(target, drafter_cfg.target_layer_ids, fingerprint["final_hidden"], data.batches(0, 1, 1),
                           plan, todo, writer, kind, encoding["layers"], device)
    seconds = time.perf_counter() - started
    if todo:
        echo(f"feature store {folder}: rank {rank} wrote {tokens:,} tokens in {seconds:.1f} s "
             f"({tokens / max(seconds, 1e-9):,.0f} tokens/s)")
    barrier()
    if rank == 0:
        manifest = finish(folder, manifest, len(lengths), tokens / max(seconds, 1e-9) if todo else None)
        echo(f"feature store {folder}: complete, {manifest['tokens']:,} tokens, {manifest['bytes'] / 2**30:.3f} GiB "
             f"({manifest['bytes'] / manifest['tokens']:.0f} bytes/token)")
    barrier()
    return manifest


def _samples(entry) -> list[int]:
    """The conversations of a plan entry (a list of ids, or of packed rows of ids)."""
    return [s for row in entry for s in (row if isinstance(row, list) else [row])]
