"""``dflash-train bench`` under torchrun (gloo, CPU): the multi-GPU scaling benchmark's code path.

Also the multi-node path: two torchrun agents (``--nnodes 2``, one worker each) that meet
at a c10d rendezvous endpoint, as two machines would.
"""

from __future__ import annotations

import json
import subprocess
import sys

from dist_helpers import VENV_BIN, env, free_port

BENCH = ["-m", "dflash_train.cli", "bench", "train.num_anchors=8", "--target-config", "tiny", "--device", "cpu", "--steps", "2",
         "--warmup", "1", "--profile-steps", "1", "--matmul-size", "256"]


def _torchrun(*args: str) -> list[str]:
    return [str(VENV_BIN / "torchrun"), *args, "--no-python", sys.executable, *BENCH]


def _check(stdout: str, world: int) -> dict:
    result = json.loads(stdout)  # exactly one JSON object: only rank 0 prints
    assert result["world_size"] == world and result["rank"] == 0
    per_step = 128 * world
    assert result["context_tokens_per_step"] == per_step
    assert abs(result["context_tokens_per_s"] - per_step / result["step_time_s"]) < 1e-6 * per_step
    assert abs(result["context_tokens_per_s_per_gpu"] * world - result["context_tokens_per_s"]) < 1e-6
    assert result["drafted_positions_per_step"] == 8 * 16 * world
    assert result["last_loss"] > 0
    return result


def test_bench_two_ranks():
    cmd = _torchrun("--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(proc.stdout, 2)


def test_bench_two_node_agents():
    """Two torchrun agents on one host, ranks assigned by the rendezvous (the multi-node launch)."""
    endpoint = f"127.0.0.1:{free_port()}"
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
              "--rdzv-id", "bench-two-nodes"]
    agents = [subprocess.Popen(_torchrun(*common), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env()) for _ in range(2)]
    outs = [a.communicate(timeout=240) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(err[-2000:] for _, err in outs)
    printed = [out for out, _ in outs if out.strip()]
    assert len(printed) == 1  # the agent that got global rank 0
    _check(printed[0], 2)
