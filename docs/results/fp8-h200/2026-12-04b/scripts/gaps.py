"""Where the GPU idles in the REF bench's timed loop (no syncs): profile 3 back-to-back steps, merge the kernels'
intervals, list the idle gaps (> 50 us) with the kernel before/after and the CPU ops running when each gap began."""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from dflash_train.bench.run import BenchConfig, StepBench

flags = set(sys.argv[1:])
cfg = BenchConfig(target_config="qwen3-8b", drafter_layers=5, block_size=16, target_layer_ids=[1, 9, 17, 25, 33],
                  num_anchors=512, seq_len=3072, batch_size=1, steps=3, warmup=2, attention="flex", compile=True,
                  device="cuda", target_fp8="fp8" in flags, compile_target=True, profile_steps=0,
                  cuda_graph_step="graph" in flags).resolved()
bench = StepBench.build(cfg, 1, 0, lambda *a: None)
bench.warm_up()
for i in range(3):  # the graphed step replays only after its eager steps and the capture
    bench.train_step(0)

torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for i in range(cfg.warmup, cfg.warmup + cfg.steps):
        bench.train_step(i)
    torch.cuda.synchronize()
events = prof.events()
kern = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
              if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
cpu = [(e.time_range.start, e.time_range.end, e.name) for e in events
       if e.device_type == torch.autograd.DeviceType.CPU]
busy, gaps, end, prev = 0.0, [], None, None
for s, e, n in kern:
    if end is not None and s > end + 50:
        running = sorted({c[2] for c in cpu if c[0] <= end <= c[1]}, key=len)[:6]
        gaps.append({"us": round(s - end, 1), "after": prev[:70], "before": n[:70], "cpu_at_start": running})
    if end is None or e > end:
        busy += e - max(s, end if end is not None else s)
        end, prev = e, n
wall = kern[-1][1] - kern[0][0]
gaps.sort(key=lambda g: -g["us"])
out = {"steps": cfg.steps, "wall_ms": round(wall / 1e3, 2), "busy_ms": round(busy / 1e3, 2),
       "idle_ms": round((wall - busy) / 1e3, 2), "gaps_over_50us": len(gaps),
       "gap_ms_total": round(sum(g["us"] for g in gaps) / 1e3, 2), "top_gaps": gaps[:25]}
cpu_ops = {}
for s, e, n in cpu:
    if n.startswith(("cudaMemcpy", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                     "aten::item", "aten::_local_scalar_dense", "aten::nonzero", "cudaHostAlloc")):
        c = cpu_ops.setdefault(n, [0, 0.0])
        c[0] += 1
        c[1] += (e - s) / 1e3
out["sync_like_cpu_ops_ms"] = {k: [v[0], round(v[1], 2)] for k, v in cpu_ops.items()}
print(json.dumps(out, indent=1))
