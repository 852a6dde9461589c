"""Profile the SmolLM2 recipe's training step on a random-weight SmolLM2-shaped target.

    python prof.py TARGET_DIR DATA.jsonl OUTDIR [overrides...]

Runs the real Trainer (recipe smollm2-1gpu + overrides) for max_steps steps; synchronized wall
times per step over windows (target steps vs cached steps), and a torch.profiler table of a few
steps of each kind.
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
print("steps per epoch", spe, flush=True)
marks = {}
prof_at = {"target": (8, 13), "cached": (spe * 2 + 8, spe * 2 + 13)}
profs = {}
edges = {20, spe - 2, spe + 5, 2 * spe - 2}
times = []


def cb(t):
    step = t.counters.step
    if step == 2 * spe + 14:
        t.total_steps = step + 1  # the next step is the last (and is logged)
    if step in edges:
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append((step, time.perf_counter()))
    for name, (a, b) in prof_at.items():
        if step == a:
            p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + ([
                                                   torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []))
            p.__enter__()
            profs[name] = p
        if step == b:
            p = profs[name]
            p.__exit__(None, None, None)
            ka = p.key_averages()
            with open(f"{out}/prof-{name}.txt", "w") as f:
                f.write(ka.table(sort_by="cuda_time_total", row_limit=60))
                f.write("\n\n")
                f.write(ka.table(sort_by="cpu_time_total", row_limit=40))
            p.export_chrome_trace(f"{out}/trace-{name}.json")


trainer.run(on_step_end=cb)


def window(a, b):
    at = dict(times)
    return (at[b] - at[a]) / (b - a) * 1000 if a in at and b in at else None


rows = [json.loads(line) for line in open(f"{out}/run/metrics.jsonl") if '"loss"' in line]
res = {"last_loss": rows[-1]["loss"] if rows else None, "steps": trainer.counters.step, "steps_per_epoch": spe, "ms_target_steps": window(20, spe - 2), "ms_cached_steps": window(spe + 5, spe * 2 - 2),
       "overrides": overrides}
if isinstance(getattr(trainer, "source", None), object) and hasattr(trainer.source, "report"):
    res["cache"] = trainer.source.report()
print(json.dumps(res), flush=True)
json.dump(res, open(f"{out}/res.json", "w"))
