# Ran on the H200 at f47c89b (the FP8 GEMMs then a torch.autograd.Function, _FP8TrainingMatmul, which this
# script patches); output: drafter-grads-before-fix.json, drafter-curves-before-fix.json. Kept as the record
# of how the zero gradients were found; it does not run on later commits.
# Run as: PYTHONPATH=src:tests python docs/results/fp8-h200/diag_fp8.py (OUT= a folder for the JSONs).
"""FP8 drafter grads on CUDA: eager vs compiled, current code and candidate fixes."""
import json, os, sys, torch
sys.path.insert(0, "tests")
from testkit import tiny_drafter, tiny_qwen3
from dflash_train.models import fp8
from dflash_train.models.target import Target
from dflash_train.train.parallelize import parallelize_drafter

dev = os.environ.get("DEV", "cuda")
target = Target(tiny_qwen3(num_layers=6, hidden=128).to(dev))
orig_backward = fp8._FP8TrainingMatmul.backward
orig_mm = fp8.fp8_mm_nt

def always_backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    gx = fp8.fp8_mm_nt(grad_out, weight.t(), ctx.emulate).to(x.dtype)
    gw = fp8.fp8_mm_nt(grad_out.t(), x.t(), ctx.emulate).to(weight.dtype)
    return gx, gw, None, None

def run(fp8_on, comp, variant="cur"):
    fp8._FP8TrainingMatmul.backward = staticmethod(always_backward if variant == "always" else orig_backward)
    fp8.fp8_mm_nt = torch.compiler.disable(orig_mm) if variant == "disable" else orig_mm
    torch._dynamo.reset()
    drafter, cfg = tiny_drafter(target, num_layers=2)
    drafter.to(dev)
    model = parallelize_drafter(drafter, False, comp, fp8=fp8_on, fp8_emulate=dev == "cpu")
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(2, 64, 128, generator=g).to(dev)
    feats = torch.randn(2, 96, 128 * len(cfg.target_layer_ids), generator=g).to(dev)
    with torch.autocast(dev, dtype=torch.bfloat16):
        out = model(embeds, feats, torch.arange(96, 160)[None].expand(2, -1).to(dev), torch.arange(96)[None].expand(2, -1).to(dev))
    out.float().square().mean().backward()
    return out.detach().float(), {n.replace("._orig_mod", ""): p.grad.clone() if p.grad is not None else None
                                  for n, p in drafter.named_parameters()}

def rel(a, b):
    if a is None or b is None:
        return None if (a is None) != (b is None) else "both None"
    return round(((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30)).item(), 4)

ref = run(False, False)
res = {}
for name, args in {"fp8-eager": (True, False), "bf16-compiled": (False, True), "fp8-compiled": (True, True),
                   "fp8-compiled-always": (True, True, "always"), "fp8-compiled-disable": (True, True, "disable"),
                   "fp8-eager-always": (True, False, "always")}.items():
    try:
        out, grads = run(*args)
        res[name] = {"out": rel(out, ref[0]), **{n: rel(gr, ref[1][n]) for n, gr in grads.items()}}
    except Exception as e:
        res[name] = {"error": repr(e)[:500]}
    print(name, json.dumps(res[name]), flush=True)
json.dump(res, open(os.environ.get("OUT", "/tmp") + "/diag_fp8.json", "w"), indent=1)

# the GPU test's training job: bf16 vs fp8, compiled (default) and not
sys.path.insert(0, "tests/gpu")
import pathlib, tempfile
from test_gpu_fp8 import _fp8_chat_job, _train_fp8_job
fp8._FP8TrainingMatmul.backward = staticmethod(orig_backward); fp8.fp8_mm_nt = orig_mm
tmp = pathlib.Path(tempfile.mkdtemp())
curves = {}
for name, on, comp, variant in (("bf16", False, True, "cur"), ("fp8", True, True, "cur"), ("fp8-nocompile", True, False, "cur"),
                                ("fp8-always", True, True, "always")):
    fp8._FP8TrainingMatmul.backward = staticmethod(always_backward if variant == "always" else orig_backward)
    torch._dynamo.reset()
    job = _fp8_chat_job(tmp, name, fp8_drafter=on, cuda_graph_step=False)
    job["train"]["compile"] = comp
    try:
        losses, _, _ = _train_fp8_job(job, tmp, name)
        curves[name] = [round(x, 2) for x in losses]
    except Exception as e:
        curves[name] = repr(e)[:400]
    print(name, curves[name], flush=True)
json.dump(curves, open(os.environ.get("OUT", "/tmp") + "/diag_curves.json", "w"))
