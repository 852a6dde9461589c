"""Distributed training on real GPUs (NCCL): the paths no gloo test can take.

    python -m pytest -m gpu tests/gpu/test_gpu_distributed.py -q     # needs 2 GPUs

Each topology trains the same 6 steps as one process on one GPU and must give the same
losses (float32 target, TF32 off: only the summation order differs). These ran hung on
the GPU before the process groups were created in one place (``distributed/groups.py``).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from dist_helpers import job, losses, tiny_target, worker  # noqa: E402

from dflash_train.config import config_from_dict  # noqa: E402
from dflash_train.train.loop import train  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]
STEPS = 6
GPU = ("train.device=cuda", "train.compile=false")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[float]:
    torch.backends.cuda.matmul.allow_tf32 = False
    folder = tmp_path_factory.mktemp("single-gpu")
    cfg = job(folder, grad_accum=2, max_steps=STEPS, device="cuda", compile=False)
    train(config_from_dict(cfg), target=tiny_target().to("cuda"), echo=lambda *a: None)
    return losses(folder / "run")


def _run(tmp_path, *args, **env):
    rc, out, err, seconds = worker(2, tmp_path, *args, *GPU, timeout=300, DFLASH_WATCHDOG_START_SECONDS="240",
                                   DFLASH_WATCHDOG_SECONDS="60", **env)
    return rc, out, err, seconds


@pytest.mark.parametrize(("targets", "drafters", "accum"), [("1", "1", "2"), ("0", "0", "1")],
                         ids=["disaggregated-1+1", "colocated-2"])
def test_two_gpus_match_one_gpu(tmp_path, reference, targets, drafters, accum):
    rc, out, err, seconds = _run(tmp_path, targets, drafters, accum, str(STEPS))
    assert rc == 0, (out + err)[-6000:]
    assert out.count("EXITED rank") == 2, out[-3000:]
    assert "backend cpu:gloo,cuda:nccl" in out
    got = losses(tmp_path / "run")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(reference), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize(("targets", "drafters", "victim"), [("1", "1", 1), ("1", "1", 0), ("0", "0", 1)],
                         ids=["disaggregated-target", "disaggregated-drafter", "colocated"])
def test_killed_rank_on_gpus_ends_the_job_within_60s_and_names_it(tmp_path, targets, drafters, victim):
    rc, out, err, _ = _run(tmp_path, targets, drafters, "1", "100000", CRASH=f"{victim}:4:kill")
    ended = time.time()
    assert rc != 0
    killed = re.search(rf"CRASHING rank {victim} at ([\d.]+)", out + err)
    assert killed, (out + err)[-3000:]
    print(f"rank {victim} killed; the job ended {ended - float(killed.group(1)):.1f} s later")
    assert ended - float(killed.group(1)) < 60
    assert f"rank      : {victim}" in err and "SIGKILL" in err, err[-3000:]
