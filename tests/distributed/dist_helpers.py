"""Builders shared by the distributed tests and their torchrun worker."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.models.target import Target

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SMOLLM2 = REPO / "assets" / "smollm2"
VENV_BIN = Path(sys.executable).parent


def tiny_target() -> Target:
    return tiny_chat_target(SMOLLM2)


def save_tiny_target(folder: Path) -> Path:
    """The tiny target as a model folder (for the CLI paths that load ``target.path``)."""
    target = tiny_target()
    target.model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return folder


def job(tmp_path: Path, **train_overrides) -> dict:
    return tiny_chat_job(tmp_path, **{"loggers": ["jsonl"], **train_overrides})


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> list[float]:
    """Per-step losses; after a restart the re-done steps overwrite the lost ones."""
    by_step = {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}
    return [by_step[s] for s in sorted(by_step)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1", "DFLASH_DIST_TIMEOUT": "60", **extra}


def torchrun_cmd(nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    return [str(VENV_BIN / "torchrun"), "--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.2", *args]


def worker(nproc: int, run: Path, *args: str, max_restarts: int = 0, timeout: float = 200, **env_extra):
    """Run tests/distributed/dist_worker.py under torchrun; returns (returncode, stdout, stderr, seconds)."""
    cmd = torchrun_cmd(nproc, str(HERE / "dist_worker.py"), str(run), *args, max_restarts=max_restarts)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**env_extra))
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start
