"""Shared fixtures: tiny random targets and drafters built from configs (no download)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from testkit import tiny_drafter, tiny_qwen3  # noqa: F401  (re-exported for tests)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = REPO / "assets" / "smollm2"


@pytest.fixture
def tiny_target():
    from dflash_train.models.target import Target

    return Target(tiny_qwen3())


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    if not (SMOLLM2 / "config.json").exists():
        pytest.fail(f"{SMOLLM2} missing: run `make assets` (python -m dflash_train.assets smollm2)")
    return SMOLLM2


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA exists (through the device tool); CPU CI skips them."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
