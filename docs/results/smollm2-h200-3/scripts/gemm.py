"""fp32 skinny GEMMs of SmolLM2's verify step: which formulation is fastest per shape.
Each op is captured 20x in a CUDA graph and replayed; per-call GPU time in us."""
import json
import sys
import time

import torch
import torch.nn.functional as F

dev = "cuda"
SHAPES = {"q/o": (576, 576), "k/v": (192, 576), "qkv": (960, 576), "gate/up": (1536, 576), "gate_up": (3072, 576),
          "down": (576, 1536), "lm_head": (49152, 576)}


def timed(fn, reps=20, rounds=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(rounds):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return 1e3 * a.elapsed_time(b) / (reps * rounds)


def splitk(x, w, s):
    n, k = w.shape
    xs = x.view(x.shape[0], s, k // s).transpose(0, 1)  # [s, m, k/s]
    ws = w.view(n, s, k // s).permute(1, 2, 0)  # [s, k/s, n]
    return torch.bmm(xs, ws).sum(0)


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "us": {}}
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev) / k ** 0.5
        row = {}
        for m in (1, 16):
            x = torch.randn(m, k, device=dev)
            ref = x.double() @ w.double().T
            variants = {
                "linear": lambda: F.linear(x, w),
                "mm_t": lambda: torch.mm(w, x.t()).t(),
                "splitk4": lambda: splitk(x, w, 4),
                "splitk8": lambda: splitk(x, w, 8),
                "bf16": lambda: F.linear(xb, wb),
            }
            xb, wb = x.bfloat16(), w.bfloat16()
            for vname, fn in variants.items():
                if vname.startswith("splitk") and k % int(vname[6:]):
                    continue
                try:
                    err = (fn().double() - ref).abs().max().item()
                    row[f"{vname}@{m}"] = {"us": round(timed(fn), 2), "err": err}
                except Exception as e:  # noqa: BLE001
                    row[f"{vname}@{m}"] = {"error": repr(e)[:200]}
            for lib in ("cublaslt",):
                try:
                    torch.backends.cuda.preferred_blas_library(lib)
                    row[f"{lib}@{m}"] = {"us": round(timed(lambda: F.linear(x, w)), 2)}
                finally:
                    torch.backends.cuda.preferred_blas_library("cublas")
            torch.backends.cuda.matmul.allow_tf32 = True
            row[f"tf32@{m}"] = {"us": round(timed(lambda: F.linear(x, w)), 2),
                                "err": (F.linear(x, w).double() - ref).abs().max().item()}
            torch.backends.cuda.matmul.allow_tf32 = False
        if "--autotune" in sys.argv:
            t0 = time.time()
            x = torch.randn(16, k, device=dev)
            try:
                f = torch.compile(lambda a, b: F.linear(a, b), mode="max-autotune-no-cudagraphs", dynamic=False)
                f(x, w)
                row["autotune@16"] = {"us": round(timed(lambda: f(x, w)), 2), "compile_s": round(time.time() - t0, 1),
                                      "err": (f(x, w).double() - x.double() @ w.double().T).abs().max().item()}
            except Exception as e:  # noqa: BLE001
                row["autotune@16"] = {"error": repr(e)[:300]}
        out["us"][name] = row
        print(name, json.dumps(row), flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
