"""The layout of a run folder: the one place that knows its file names.

Training writes a run folder, and resume, export, the curve plot and the CLI read it. The
names below are the contract between them; every module asks this one instead of
spelling a name itself (``tests/test_run_folder.py`` checks that), so that a name cannot
drift between the writer and a reader::

    RUN/
      config.json                 the resolved job config (+ ``drafter_resolved``)
      metrics.jsonl               one JSON record per logged step (loss, acceptance, tau, ...)
      summary.json                the job's summary; ``checkpoint`` names its final checkpoint
      compile-artifacts.bin       torch.compile's portable cache (train/compilation.py)
      tensorboard/                event files
      checkpoints/step-00000120/  one checkpoint (train/checkpoint.py lists what it holds):
        config.json               the job config again, so a checkpoint stands alone
        drafter_config.json       the resolved drafter config    } what ``export`` reads
        drafter.safetensors       the full drafter weights       }
        checksums.json            sha256 and size of every other file
        COMPLETE                  written last: a folder without it is never used

A checkpoint folder is ``step-<N>`` with N an integer (the trainer pads it to 8 digits;
any padding is read). Only the standard library is imported here, so that any layer may
ask.
"""

from __future__ import annotations

import re
from pathlib import Path

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
COMPILE_ARTIFACTS = "compile-artifacts.bin"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"

DRAFTER_CONFIG = "drafter_config.json"
DRAFTER_WEIGHTS = "drafter.safetensors"
CHECKSUMS = "checksums.json"
COMPLETE = "COMPLETE"

_STEP_PREFIX = "step-"
_STEP_NAME = re.compile(rf"^{_STEP_PREFIX}(\d+)$")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives (whether or not it exists)."""
    return Path(run_dir) / CHECKPOINTS / f"{_STEP_PREFIX}{step:08d}"


def checkpoint_step(path: str | Path) -> int:
    """The step a checkpoint folder's name says; -1 for a name that is not ``step-<N>``."""
    match = _STEP_NAME.match(Path(path).name)
    return int(match.group(1)) if match else -1


def is_complete(folder: str | Path) -> bool:
    """The folder carries the marker written after everything else was on disk."""
    return (Path(folder) / COMPLETE).is_file()


def checkpoint_folders(run_dir: str | Path) -> list[Path]:
    """Every ``checkpoints/step-<N>`` folder of a run, complete or not, oldest first."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if checkpoint_step(p) >= 0 and p.is_dir()]
    return sorted(found, key=checkpoint_step)


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run, oldest first."""
    return [p for p in checkpoint_folders(run_dir) if is_complete(p)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (None: it has none)."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None
