"""``dflash-train plan``: measure target and drafter throughput, recommend a topology.

On one device it times (after a warm-up) the target's features-only forward and the
drafter's forward + backward + optimizer step on those features, with the job's real
config and data, then predicts for G GPUs:

* colocated: every GPU does both, ``G / (1/target_rate + 1/drafter_rate)`` tokens/s;
* N target + M drafter GPUs (N + M = G): ``min(N * target_rate, M * drafter_rate)``.

Transfer cost between target and drafter GPUs is not modelled (NVLink makes it small
next to either side's compute; across nodes it is not). In this model the best split can
at most tie colocated (exactly when N/M = drafter_rate/target_rate); ties go to colocated.
A split wins in practice when colocated does not fit in memory (target + drafter + optimizer
on one GPU) or when a target GPU alone runs faster than its share of a colocated GPU.
"""

from __future__ import annotations

import json
import time

from dflash_train.config import JobConfig
from dflash_train.devices import synchronize


def measure(cfg: JobConfig, steps: int = 3, echo=print) -> dict:
    """Tokens/s of the target (features only) and of the drafter (train step on cached features)."""
    from dflash_train.train.features import CachedFeatures, LocalFeatures
    from dflash_train.train.trainer import Trainer

    if cfg.objective.needs_target_distribution:
        raise ValueError("objective.targets kl/tv need colocated training; plan the topology with objective.targets "
                         "{ce: 1}")
    cfg.train.progress = False
    trainer = Trainer(cfg, echo=echo, features=lambda t: CachedFeatures(LocalFeatures(t)))
    micro = [mb for _ in range(steps + 1) for mb in trainer.source.next_step()]
    per_step = cfg.train.grad_accum
    target_time, target_tokens = 0.0, 0
    for i, mb in enumerate(micro):  # fills the cache the drafter's steps then read
        ids, attention = mb.input_ids.to(trainer.device), mb.attention_mask.to(trainer.device)
        synchronize(trainer.device)
        start = time.perf_counter()
        trainer.source.features(mb, ids, attention)
        synchronize(trainer.device)
        if i >= per_step:  # the first step is a warm-up
            target_time += time.perf_counter() - start
            target_tokens += int(mb.attention_mask.sum())
    drafter_time, drafter_tokens = 0.0, 0
    for s in range(steps + 1):
        batch = micro[s * per_step:(s + 1) * per_step]
        synchronize(trainer.device)
        start = time.perf_counter()
        trainer.train_step(batch)
        synchronize(trainer.device)
        if s > 0:
            drafter_time += time.perf_counter() - start
            drafter_tokens += sum(int(mb.attention_mask.sum()) for mb in batch)
    return {"device": str(trainer.device), "target_tokens_per_s": target_tokens / max(target_time, 1e-9),
            "drafter_tokens_per_s": drafter_tokens / max(drafter_time, 1e-9)}


def recommend(target_rate: float, drafter_rate: float, gpus: int) -> dict:
    """Predicted tokens/s of colocated and of every N:M split; the best option."""
    options = [{"topology": "colocated", "target_ranks": 0, "drafter_ranks": 0,
                "tokens_per_s": gpus / (1 / target_rate + 1 / drafter_rate)}]
    for n in range(1, gpus):
        m = gpus - n
        options.append({"topology": f"{n}+{m}", "target_ranks": n, "drafter_ranks": m,
                        "tokens_per_s": min(n * target_rate, m * drafter_rate)})
    best = max(options, key=lambda o: o["tokens_per_s"])
    return {"gpus": gpus, "target_tokens_per_s": target_rate, "drafter_tokens_per_s": drafter_rate,
            "options": options, "recommended": best}


def command(best: dict, gpus: int, config: str) -> str:
    launch = f"torchrun --nproc-per-node {gpus} -m dflash_train.distributed.launch {config}"
    if best["target_ranks"]:
        launch += f" --target-ranks {best['target_ranks']} --drafter-ranks {best['drafter_ranks']}"
    return launch


def format_table(result: dict) -> str:
    lines = [f"target {result['target_tokens_per_s']:.0f} tok/s, drafter {result['drafter_tokens_per_s']:.0f} tok/s "
             f"per device; predictions for {result['gpus']} GPUs:",
             f"{'topology':<22}{'tokens/s':>12}",
             "-" * 34]
    for o in result["options"]:
        name = "colocated" if o["topology"] == "colocated" else f"{o['target_ranks']} target + {o['drafter_ranks']} drafter"
        mark = "  <- recommended" if o is result["recommended"] else ""
        lines.append(f"{name:<22}{o['tokens_per_s']:>12.0f}{mark}")
    return "\n".join(lines)


def run_plan(args) -> int:
    from dflash_train.config import load_config

    overrides = list(args.overrides) + ["train.progress=false", "train.loggers=[jsonl]"]
    cfg = load_config(args.config, overrides)
    rates = measure(cfg, steps=args.steps, echo=print)
    result = recommend(rates["target_tokens_per_s"], rates["drafter_tokens_per_s"], args.gpus)
    result["measured_on"] = rates["device"]
    result["command"] = command(result["recommended"], args.gpus, args.config)
    print(format_table(result))
    print("recommended: " + result["command"])
    print(json.dumps(result))
    return 0
