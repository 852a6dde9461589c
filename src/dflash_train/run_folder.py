"""The layout of a run folder: the one place that knows its file names.

Training writes a run folder, and resume, export, the curve plot and the CLI read it. The
names below are the contract between them; every module asks this one instead of
spelling a name itself (``tests/test_run_folder.py`` checks that), so that a name cannot
drift between the writer and a reader::

    RUN/
      run.lock                    held while a run writes the folder (run_lock.py)
      config.json                 the resolved job config (+ ``drafter_resolved``)
      metrics.jsonl               one JSON record per logged step (loss, acceptance, tau, ...)
      summary.json                the job's summary; ``checkpoint`` names its final checkpoint
      compile-artifacts.bin       torch.compile's portable cache (train/compilation.py)
      tensorboard/                event files (train.loggers: tensorboard)
      tracking.json               the run ids of the tracking backends (wandb, mlflow), so a resume
                                  continues the same tracked run (tracking/)
      wandb/                      wandb's own run folders (train.loggers: wandb, train.wandb_dir unset)
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
import shutil
from collections.abc import Callable
from pathlib import Path

from dflash_train.files import CHECKSUMS as _CHECKSUMS
from dflash_train.files import file_checksums as _file_checksums
from dflash_train.files import verify_checksums

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
COMPILE_ARTIFACTS = "compile-artifacts.bin"
TENSORBOARD = "tensorboard"
TRACKING = "tracking.json"
CHECKPOINTS = "checkpoints"
LOCK = "run.lock"
WRITE_TODO = "free space or set train.run_dir elsewhere"  # the advice of a failed write in the run folder

DRAFTER_CONFIG = "drafter_config.json"
DRAFTER_WEIGHTS = "drafter.safetensors"
CHECKSUMS = _CHECKSUMS  # sha256 and size of every file of a checkpoint (files.py)
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


SET_ASIDE = ".old"  # ``step-N.old``: the step N a same-step save is replacing (``CheckpointManager._commit``)


def restore_set_aside(run_dir: str | Path, echo: Callable[[str], None] = print) -> None:
    """Settle the ``step-N.old`` folders a killed save left; call holding the run's lock.

    A save that replaces a checkpoint of the same step (a finished run resumed saves its last
    step again) renames the old ``step-N`` to ``step-N.old`` before renaming the new one in. A
    kill between the two renames leaves no ``step-N`` at all: the only complete copy is the
    ``.old``, which no reader looks at, so a resume would silently fall back to an older step
    (or, with ``train.keep_last=1``, start again from step 0), and the folder stayed forever. So:
    beside a complete ``step-N`` (the kill came after the second rename) the ``.old`` is removed;
    alone and complete, it is renamed back. Each with a one-line note."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return
    for old in sorted(folder.glob(f"{_STEP_PREFIX}*{SET_ASIDE}")):
        final = old.with_name(old.name[: -len(SET_ASIDE)])
        if checkpoint_step(final) < 0 or not old.is_dir():
            continue
        if is_complete(final):
            shutil.rmtree(old, ignore_errors=True)
            echo(f"dflash-train: removed {old}: a save that replaced it was killed before removing it")
        elif is_complete(old) and not final.exists():
            old.rename(final)
            echo(f"dflash-train: put {final} back: a save killed while replacing it had set it aside as {old.name}")


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


# -- integrity (files.py holds the checksum helpers every folder we read back uses) ------------
def file_checksums(folder: Path) -> dict[str, dict]:
    """``{relative path: {"sha256", "bytes"}}`` of every file of a checkpoint but its COMPLETE marker."""
    return _file_checksums(folder, skip=(COMPLETE,))


def verify_checkpoint(path: Path) -> str | None:
    """None when every file matches its recorded checksum, else what is wrong (one line). A
    checkpoint from before checksums existed (no ``checksums.json``) passes unverified."""
    return verify_checksums(path, missing_ok=True)


def newest_verified(run_dir: str | Path, usable=is_complete, on_corrupt=None) -> Path | None:
    """The newest checkpoint of a run that ``usable`` accepts (default: complete) and whose files
    match their checksums; None when the run has no usable one. A newer one that does not verify is
    passed over and reported to ``on_corrupt(folder, problem)``; usable ones that all fail are an
    error. What ``train.resume=auto`` resumes from and what ``export`` exports from a run folder."""
    candidates = [folder for folder in checkpoint_folders(run_dir) if usable(folder)]
    for folder in reversed(candidates):
        problem = verify_checkpoint(folder)
        if problem is None:
            return folder
        if on_corrupt is not None:
            on_corrupt(folder, problem)
    if candidates:
        raise ValueError(f"{run_dir}: none of its {len(candidates)} complete checkpoint(s) verifies against "
                         f"its checksums")
    return None


