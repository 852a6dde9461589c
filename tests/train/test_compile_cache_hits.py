"""``compile_cache_result``: whether this run's compiled graphs came from inductor's cache.

A cache folder's state (empty or warm) says nothing about this run's graphs: a folder warm
with other shapes' graphs still compiles everything. The counters do: a fresh cache folder
gives misses, the same folder in a fresh process gives hits (inductor's C++ backend on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_train.train.compilation import cache_result

SRC = Path(__file__).resolve().parents[2] / "src"

# One process = one run: FirstStep around a compiled forward + backward (a training step's
# shape); then the same step again (in memory: no lookup) and, with "new-shape", a shape the
# cache has never seen, so that the process as a whole mixes hits and a miss.
SCRIPT = """
import json, sys
from pathlib import Path
import torch
from dflash_train.train import compilation

def step(x, w):
    return torch.nn.functional.gelu(x @ w).square().mean()

start = compilation.cache_lookups()
lines = []
first = compilation.FirstStep(Path(sys.argv[1]), None, enabled=True, is_main=False, echo=lines.append)
w = torch.randn(16, 16, requires_grad=True, generator=torch.Generator().manual_seed(0))
compiled = torch.compile(step, dynamic=False)
compiled(torch.ones(8, 16), w).backward()
report = first.done(1.0)
mark = compilation.cache_lookups()
compiled(torch.ones(8, 16), w).backward()
again = compilation.cache_result(compilation.lookups_since(mark))
if sys.argv[2] == "new-shape":
    compiled(torch.ones(4, 16), w).backward()
whole = compilation.cache_result(compilation.lookups_since(start))
print("RESULT", json.dumps({"report": report, "lines": lines, "again": again, "whole": whole}))
"""


def _run(tmp_path: Path, cache: Path, name: str, then: str = "nothing") -> dict:
    script = tmp_path / "compile_once.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(SRC)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / name), then], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


def test_cache_result_from_counts():
    def lookups(hit, miss, bypass=0):
        return {"fx_graph": {"hit": hit, "miss": miss, "bypass": bypass},
                "aot_autograd": {"hit": 0, "miss": 0, "bypass": 0}}

    assert cache_result(lookups(0, 0)) == "none"
    assert cache_result(lookups(3, 0)) == "hit"
    assert cache_result(lookups(0, 3)) == "miss"
    assert cache_result(lookups(2, 1)) == "partial"
    assert cache_result(lookups(2, 0, bypass=1)) == "partial"  # a bypassed graph is compiled anew
    assert cache_result(lookups(0, 0, bypass=1)) == "miss"


@pytest.mark.slow  # two processes each compiling a forward and a backward graph
def test_fresh_cache_misses_then_a_fresh_process_hits(tmp_path):
    cache = tmp_path / "inductor"
    cold = _run(tmp_path, cache, "cold")
    report = cold["report"]
    assert report["compile_cache"] == "empty" and report["compile_cache_result"] == "miss"
    fx, aot = report["compile_cache_lookups"]["fx_graph"], report["compile_cache_lookups"]["aot_autograd"]
    assert fx["hit"] == 0 and fx["miss"] >= 2  # the forward and the backward graph
    assert aot["hit"] == 0 and aot["miss"] >= 1
    assert "cache empty, this run: miss" in cold["lines"][-1]
    assert cold["again"] == "none" and cold["whole"] == "miss"

    warm = _run(tmp_path, cache, "warm", "new-shape")  # a new process, the same cache folder
    report = warm["report"]
    assert report["compile_cache"] == "warm" and report["compile_cache_result"] == "hit"
    lookups = report["compile_cache_lookups"]
    assert lookups["fx_graph"] == {"hit": fx["miss"], "miss": 0, "bypass": 0}
    assert lookups["aot_autograd"] == {"hit": aot["miss"], "miss": 0, "bypass": 0}
    assert report["compile_graphs"] == {"from_cache": fx["miss"], "compiled": 0}
    assert "cache warm, this run: hit" in warm["lines"][-1]
    assert warm["again"] == "none" and warm["whole"] == "partial"  # the first step's graphs hit, the new shape's missed
