"""Entry point of a distributed job (also reached through ``dflash-train train`` under torchrun).

    torchrun --nproc-per-node 8 -m dflash_train.distributed.launch CONFIG [overrides]
    torchrun --nproc-per-node 8 -m dflash_train.distributed.launch CONFIG --target-ranks 5 --drafter-ranks 3

Under torchrun with ``--max-restarts K``, a restarted job (``TORCHELASTIC_RESTART_COUNT``
> 0) resumes from the newest complete checkpoint of ``train.run_dir`` automatically.
"""

from __future__ import annotations

import argparse
import sys

import torch.distributed as dist

from dflash_train.cli_types import nonneg_int
from dflash_train.config import JobConfig, TargetConfig, job_from_args
from dflash_train.data import DataConfig
from dflash_train.devices import resolve_device, resolve_dtype
from dflash_train.distributed import watchdog
from dflash_train.distributed.common import AgreedRanks
from dflash_train.distributed.disagg import FeatureReceiver, TargetServer, Topology, strip_decoder_layers
from dflash_train.distributed.env import DistEnv, init_from_env, restart_count, shutdown
from dflash_train.distributed.groups import Groups, build_groups
from dflash_train.tracking.base import SinkSettings
from dflash_train.tracking.registry import check_loggers
from dflash_train.train.assembly import load_target
from dflash_train.train.features import LocalFeatures, TimedFeatures
from dflash_train.train.loop import tokenize_before_target, train
from dflash_train.train.parallelize import DataParallel, parallelize_target
from dflash_train.train.timings import Timings


def _load_target(cfg: TargetConfig, target, device, layers: bool = True):
    """``target``: None (load it as ``cfg`` says; ``layers=False``: its head only, for a feature store), a
    ``Target``, or a zero-argument factory (tests)."""
    if target is None:
        return load_target(cfg, device, resolve_dtype(cfg.dtype, device), layers=layers)
    loaded = target() if callable(target) and not hasattr(target, "facts") else target
    return loaded.to(device)  # a target built elsewhere (tests, notebooks) trains on this rank's device


def run(cfg: JobConfig, target=None, target_ranks: int = 0, drafter_ranks: int = 0, echo=print) -> dict:
    """Train ``cfg`` on the ranks torchrun started (one process when WORLD_SIZE is 1)."""
    env = init_from_env(cfg.train.device)
    if restart_count() > 0 and not cfg.train.resume:
        cfg.train.resume = "auto"
        echo(f"rank {env.rank}: torchrun restart {restart_count()}: resuming from the newest checkpoint")
    if env.device.type == "cuda" and cfg.train.device in ("auto", "cuda"):
        cfg.train.device = str(env.device)
    try:
        topo = Topology.build(env.world, target_ranks, drafter_ranks)
        if env.distributed:
            role = "colocated" if not topo.disaggregated else ("drafter" if topo.is_drafter(env.rank) else "target")
            watchdog.start(env.rank, role)
        if env.rank == 0:  # a tracking backend that cannot start: one line before any rank loads the target
            watchdog.beat("checking train.loggers")
            check_loggers(SinkSettings.of_job(cfg, resuming=bool(cfg.train.resume)))
        if target is None and env.rank == 0:  # bad data fails before any rank's target load ends
            watchdog.beat("tokenizing the data set before loading the target")
            tokenize_before_target(cfg.data, cfg.target, cfg.drafter.block_size)
        if env.distributed:
            watchdog.beat("creating process groups")
        groups = build_groups(topo.drafters() if topo.disaggregated else list(range(env.world)), env.world, env.rank)
        if not env.distributed:
            if cfg.train.fsdp_drafter or cfg.train.fsdp_target:
                echo("one process: train.fsdp_* ignored")
            result = train(cfg, target=_load_target(cfg.target, target, resolve_device(cfg.train.device),
                                                    layers=cfg.train.loads_target_layers), echo=echo)
        elif topo.disaggregated:
            result = _run_disaggregated(cfg, env, topo, groups, target, echo)
        else:
            result = _run_colocated(cfg, env, groups, target, echo)
        watchdog.beat("shutting down")
    except BaseException:
        watchdog.stop()
        shutdown(clean=False)
        raise
    shutdown()
    watchdog.stop()
    return result


def _echo_for(env: DistEnv, echo):
    return echo if env.rank == 0 else (lambda *a, **k: None)


def _data_cache_first_on_rank0(data: DataConfig, block_size: int, target, env: DistEnv) -> None:
    """Rank 0 tokenizes and caches the data set while the others wait: concurrent builds of
    one cache entry would race; afterwards every rank reads the cache."""
    if env.rank == 0:
        from dflash_train.data import load_tokenized

        load_tokenized(data, target.tokenizer, block_size)
    watchdog.beat("waiting for rank 0 to build the data cache")
    dist.barrier()
    watchdog.beat("building the drafter; the first step compiles on a cold cache")


def _run_colocated(cfg: JobConfig, env: DistEnv, groups: Groups, target, echo) -> dict:
    device = resolve_device(cfg.train.device)
    ranks = AgreedRanks(env.rank, env.world, groups.drafters, control=groups.control)
    timings = Timings(device)
    store = not cfg.train.loads_target_layers  # each rank reads the store: no target forward to time
    loaded = _load_target(cfg.target, target, device, layers=not store)
    if cfg.train.fsdp_target:
        parallelize_target(loaded, groups.drafters, device)
    _data_cache_first_on_rank0(cfg.data, cfg.drafter.block_size, loaded, env)
    echo_fn = _echo_for(env, echo)
    echo_fn(f"colocated: {env.world} ranks, backend {env.backend}, device {device}")
    return train(cfg, target=loaded, ranks=ranks, echo=echo_fn, timings=timings,
                 features=None if store else (lambda trainer: TimedFeatures(LocalFeatures(trainer), timings)),
                 data_parallel=DataParallel(groups.drafters, device, fsdp=cfg.train.fsdp_drafter))


def _run_disaggregated(cfg: JobConfig, env: DistEnv, topo: Topology, groups: Groups, target, echo) -> dict:
    if cfg.train.fsdp_target:
        raise ValueError("train.fsdp_target is for colocated runs; with --target-ranks each target rank "
                         "holds a whole target")
    if cfg.train.drafter_init == "target":
        raise ValueError("train.drafter_init=target is not supported with --target-ranks yet (drafter ranks "
                         "hold no target layers): use it in a colocated run")
    if cfg.objective.needs_target_distribution:
        raise ValueError("objective.targets kl/tv need colocated training (drafter ranks get no target logits "
                         "from --target-ranks)")
    if cfg.train.feature_cache == "disk":
        raise ValueError("train.feature_cache=disk writes the store from a local target's first epoch; with "
                         "--target-ranks write it first (dflash-train features) and train with train.feature_store")
    if cfg.eval.prompts:
        raise ValueError("held-out evaluation (eval.prompts) is not supported with --target-ranks yet: "
                         "set eval.prompts=null, or evaluate the exported drafter afterwards")
    device = resolve_device(cfg.train.device)
    loaded = _load_target(cfg.target, target, device)
    _data_cache_first_on_rank0(cfg.data, cfg.drafter.block_size, loaded, env)
    if not topo.is_drafter(env.rank):
        echo(f"target rank {env.rank}: serving drafter ranks 0..{topo.drafter_ranks - 1}")
        server = TargetServer(loaded, topo, env.rank, device, env.comm_device, cfg, echo=echo)
        totals = server.serve()
        del server, loaded
        return {"role": "target", **totals}

    strip_decoder_layers(loaded)  # features come from the target ranks
    ranks = AgreedRanks(env.rank, topo.drafter_ranks, groups.drafters, control=groups.control)
    timings = Timings(device)
    echo_fn = _echo_for(env, echo)
    echo_fn(f"disaggregated: {topo.drafter_ranks} drafter ranks (0..{topo.drafter_ranks - 1}), "
            f"{topo.target_ranks} target ranks ({topo.drafter_ranks}..{topo.world - 1}), backend {env.backend}")
    return train(cfg, target=loaded, ranks=ranks, echo=echo_fn, timings=timings,
                 features=lambda trainer: FeatureReceiver(trainer, topo, env.rank, env.comm_device, timings),
                 data_parallel=DataParallel(groups.drafters, device, fsdp=cfg.train.fsdp_drafter))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dflash_train.distributed.launch", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser, with_config: bool = True) -> None:
    if with_config:
        p.add_argument("config", help="a YAML/JSON config file or a recipe name")
        p.add_argument("overrides", nargs="*", help="section.key=value")
        p.add_argument("--resume", default=None, help="a checkpoint folder, or 'auto'")
    p.add_argument("--target-ranks", type=nonneg_int, default=0,
                   help="disaggregated: ranks that run the target (0, the default: every rank runs both)")
    p.add_argument("--drafter-ranks", type=nonneg_int, default=0,
                   help="disaggregated: ranks that train the drafter (0, the default: every rank runs both)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(job_from_args(args), target_ranks=args.target_ranks, drafter_ranks=args.drafter_ranks)
    except (ValueError, FileNotFoundError) as err:
        print(f"dflash-train (distributed): error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
