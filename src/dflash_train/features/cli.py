"""``dflash-train features``: write a job's feature store (one process, or every rank under torchrun)."""

from __future__ import annotations

import argparse

from dflash_train.cli_types import float_in
from dflash_train.config import job_from_args, recipe_names
from dflash_train.features.format import DTYPES


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
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: the target's dtype (exactly what online training reads); bfloat16; float8: e4m3 with "
                        "a float32 scale per token and layer (about half of bfloat16)")
    p.add_argument("--shard-mib", type=float_in(0.0, low_open=True), default=256.0, help="bytes per shard file, in MiB (default 256)")
    p.add_argument("--verify", action="store_true",
                   help="rehash every shard already written and rewrite those that changed")
    p.set_defaults(func=run_features)


def run_features(args) -> int:
    import torch.distributed as dist

    from dflash_train.distributed.env import init_from_env, launched_by_torchrun, shutdown
    from dflash_train.features.writer import dump

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
