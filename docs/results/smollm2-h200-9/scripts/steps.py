"""Unprofiled step times of the SmolLM2 recipe (any overrides) on a given target and data.

    python steps.py TARGET_DIR DATA.jsonl OUTDIR [overrides...]

Runs the real Trainer for two epochs + 15 steps; synchronized wall times per step over windows
of target steps (first epoch) and cached steps (second epoch, train.feature_cache=device).
"""

import json
import sys
import time

import torch

from dflash_train.config import load_config
from dflash_train.train.trainer import Trainer

target, data, out = sys.argv[1:4]
overrides = sys.argv[4:]
cfg = load_config("smollm2-1gpu", [f"target.path={target}", f"data.paths=[{data}]", "eval.prompts=null",
                                   "train.progress=false", "train.time_budget_minutes=0", "train.log_every=1000",
                                   f"train.run_dir={out}/run", f"data.cache_dir={out}/cache", *overrides])
trainer = Trainer(cfg)
spe = trainer.steps_per_epoch
edges = {20, spe - 2, spe + 5, 2 * spe - 2}
times = []
t0 = time.perf_counter()


def cb(t):
    step = t.counters.step
    if step == 1:
        torch.cuda.synchronize()
        times.append(("first", time.perf_counter() - t0))
    if step == 2 * spe + 14:
        t.total_steps = step + 1
    if step in edges:
        torch.cuda.synchronize()
        times.append((step, time.perf_counter()))


trainer.run(on_step_end=cb)
at = dict(times)


def window(a, b):
    return (at[b] - at[a]) / (b - a) * 1000 if a in at and b in at else None


rows = [json.loads(line) for line in open(f"{out}/run/metrics.jsonl") if '"loss"' in line]
graph = trainer.step.graph
res = {"last_loss": rows[-1]["loss"] if rows else None, "steps": trainer.counters.step, "steps_per_epoch": spe,
       "first_step_s": at.get("first"), "ms_target_steps": window(20, spe - 2),
       "ms_cached_steps": window(spe + 5, spe * 2 - 2), "overrides": overrides,
       "graph": None if graph is None else {"enabled": graph.enabled, "replays": graph.replays},
       "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
       "feature_cache": trainer.source.report() if hasattr(trainer.source, "report") else None}
print(json.dumps(res), flush=True)
json.dump(res, open(f"{out}/res.json", "w"))
