"""Builders shared by the distributed tests and their torchrun worker (copied from tests/test_train.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from dflash_train.models.target import Target
from dflash_train.testing import tiny_qwen3

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SMOLLM2 = REPO / "assets" / "smollm2"
VENV_BIN = Path(sys.executable).parent
WORDS = "the cat sat on a mat and looked at the big red dog while it ran around the green park".split()  # noqa: SIM905


def write_chat_data(path: Path, n: int = 48) -> Path:
    lines = []
    for i in range(n):
        answer = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(40 + i % 7))
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"Tell me story {i}."},
                                              {"role": "assistant", "content": answer}]}))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # ranks write it concurrently: atomically
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def tiny_target() -> Target:
    from transformers import AutoTokenizer

    model = tiny_qwen3(num_layers=6, hidden=64, vocab=49152, tie=True)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.5)
    return Target(model, AutoTokenizer.from_pretrained(SMOLLM2))


def save_tiny_target(folder: Path) -> Path:
    """The tiny target as a model folder (for the CLI paths that load ``target.path``)."""
    target = tiny_target()
    target.model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return folder


def job(tmp_path: Path, **train_overrides) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = write_chat_data(tmp_path / "train.jsonl")
    return {
        "target": {"path": "unused-when-passed-in", "dtype": "float32"},
        "drafter": {"num_hidden_layers": 1, "block_size": 4, "num_target_features": 2},
        "data": {"paths": [str(data)], "max_length": 128, "token_budget": 256, "pad_to_multiple": 32,
                 "cache_dir": str(tmp_path / "cache")},
        "optim": {"lr": 1e-2, "warmup_ratio": 0.1},
        "train": {"run_dir": str(tmp_path / "run"), "device": "cpu", "max_steps": 16, "num_anchors": 8,
                  "log_every": 1, "progress": False, "tensorboard": False, **train_overrides},
    }


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
