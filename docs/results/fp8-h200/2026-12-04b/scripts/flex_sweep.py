"""Flex attention fwd+bwd at the REF bench's drafter shapes (512 sorted anchors x 16 over 3072 context tokens,
32 query / 8 kv heads, head_dim 128, bf16, the trainer's BlockMask) for a set of kernel_options; JSON to stdout."""
import json
import sys
import time

import torch
from torch.nn.attention.flex_attention import flex_attention

from dflash_train.models.attention import flex_block_masks

torch._dynamo.config.cache_size_limit = 64
S, B, N, HQ, HKV, D = 3072, 16, 512, 32, 8, 128
dev = "cuda"
g = torch.Generator().manual_seed(0)
cand = torch.arange(16, S - 1)
anchors = cand[torch.randperm(cand.numel(), generator=g)[:N]].sort().values[None].to(dev)
keep = torch.ones_like(anchors, dtype=torch.bool)
mask = flex_block_masks(("full_attention",), anchors, keep, S, B, None)["full_attention"]
pairs = B * (anchors.float() + B).sum().item()
fwd_flop = 4 * pairs * HQ * D
q = torch.randn(1, HQ, N * B, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(1, HKV, S + N * B, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(1, HKV, S + N * B, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
go = torch.randn(1, HQ, N * B, D, device=dev, dtype=torch.bfloat16)


def bwd(m1, n1, m2, n2, stages, warps):
    return {"bwd_BLOCK_M1": m1, "bwd_BLOCK_N1": n1, "bwd_BLOCK_M2": m2, "bwd_BLOCK_N2": n2,
            "bwd_num_stages": stages, "bwd_num_warps": warps}


def fwd(m, n, stages, warps):
    return {"fwd_BLOCK_M": m, "fwd_BLOCK_N": n, "fwd_num_stages": stages, "fwd_num_warps": warps}


CONFIGS = {
    "default": {},
    "b64-64-64-64-s3-w4": bwd(64, 64, 64, 64, 3, 4),
    "b64-64-64-64-s2-w8": bwd(64, 64, 64, 64, 2, 8),
    "b32-128-128-32-s3-w4": bwd(32, 128, 128, 32, 3, 4),
    "b64-128-128-64-s2-w8": bwd(64, 128, 128, 64, 2, 8),
    "b32-64-64-32-s3-w4": bwd(32, 64, 64, 32, 3, 4),
    "b64-128-128-64-s3-w4": bwd(64, 128, 128, 64, 3, 4),
    "b32-128-128-32-s2-w8": bwd(32, 128, 128, 32, 2, 8),
    "f128-128-s2-w8": fwd(128, 128, 2, 8),
    "f64-128-s3-w4": fwd(64, 128, 3, 4),
    "f128-64-s2-w8": fwd(128, 64, 2, 8),
}
only = sys.argv[1:] or list(CONFIGS)


def timed(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


ref = None
results = {"pairs": pairs, "fwd_tflop": fwd_flop / 1e12, "mask_kv_blocks": int(mask.kv_num_blocks.sum()),
           "mask_full_blocks": int(mask.full_kv_num_blocks.sum()), "configs": {}}
for name in only:
    opts = CONFIGS[name]
    torch._dynamo.reset()
    f = torch.compile(flex_attention, dynamic=False)
    t0 = time.time()
    try:
        def step():
            out = f(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=opts or None)
            out.backward(go)
            return out
        out = step()
        torch.cuda.synchronize()
        compile_s = time.time() - t0
        with torch.no_grad():
            fwd_ms = timed(lambda: f(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=opts or None))
        both_ms = timed(step)
        check = out.detach().float()
        if ref is None:
            ref = (check, q.grad.detach().float().clone())
        err = (check - ref[0]).abs().max().item()
        row = {"compile_s": round(compile_s, 1), "fwd_ms": round(fwd_ms, 3), "fwd_bwd_ms": round(both_ms, 3),
               "bwd_ms": round(both_ms - fwd_ms, 3), "fwd_tflops": round(fwd_flop / fwd_ms / 1e9),
               "bwd_tflops": round(2.5 * fwd_flop / (both_ms - fwd_ms) / 1e9), "max_out_diff": err}
    except Exception as e:  # noqa: BLE001
        row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    q.grad = k.grad = v.grad = None
    results["configs"][name] = row
    print(name, row, flush=True)
print(json.dumps(results))
