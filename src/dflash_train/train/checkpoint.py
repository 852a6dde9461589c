"""Checkpoints that resume exactly, written atomically, loaded without unpickling.

What a checkpoint folder holds (its name and the shared file names belong to
``dflash_train.run_folder``)::

    state/                  torch.distributed.checkpoint in safetensors form (every rank
                            writes its shards): drafter weights + optimizer moments/steps
    optim_groups.json       the optimizer's non-tensor hyperparameters (lr, betas, ...)
    trainer_state.json      one entry per stateful part: step/sample/token counters,
                            data-loader position, scheduler
    config.json             the resolved job config (JSON, never pickled)
    drafter_config.json     the resolved drafter config  } what ``export`` reads
    drafter.safetensors     the full drafter weights     }
    checksums.json          sha256 and size of every file above
    COMPLETE                written last: a folder without it is never loaded

No RNG state is saved: nothing in a training step draws from a global generator (anchors
come from generators seeded by seed, epoch and sample; the batch plan from seed and epoch;
the drafter has no dropout), so a resumed run equals an uninterrupted one without it
(``tests/train/test_checkpoint_manager.py`` scrambles every global RNG before a resume to
keep it so). Checkpoints written before carry an ``rng/`` folder; it is ignored.

The folder is written as ``step-N.tmp`` and renamed when complete, so a crash in the
middle of a save leaves the previous checkpoint the newest loadable one. Loading
uses the safetensors-based DCP reader and JSON: no pickle anywhere.

Bytes can still rot after a save (a bad disk, a half-synced copy, a stray write): the
checksums are verified before a checkpoint is used, so ``resume=auto`` falls back to the
newest checkpoint that verifies (``run_folder.newest_verified``, as ``export`` does) and says
so, instead of training on garbage; an explicit resume path that does not verify is an error.

Pruning (``train.keep_last``) only ever deletes checkpoints of this run's own history:
those it wrote, and those at or before the step it resumed from; never one of a later
step, and never the one ``summary.json`` names. ``CheckpointManager`` keeps that history.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from dflash_train.faultpoints import reached
from dflash_train.files import (
    SealMismatch,
    UserFacingError,
    describe_os_error,
    note,
    read_sealed_json,
    read_text,
)
from dflash_train.run_folder import (
    CHECKSUMS,
    COMPLETE,
    CONFIG,
    DRAFTER_CONFIG,
    DRAFTER_WEIGHTS,
    SET_ASIDE,
    SUMMARY,
    checkpoint_dir,
    checkpoint_step,
    complete_checkpoints,
    file_checksums,
    is_complete,
    latest_checkpoint,
    newest_verified,
    verify_checkpoint,
)
from dflash_train.tracking.registry import resumable_keys

# Single-process saving/loading is intended here; DCP would warn on every call that it
# "assumes" it.
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)

# Config fields that may change on resume without changing what is being trained.
RESUMABLE_CHANGES = {"train.max_steps", "train.epochs", "train.log_every", "train.save_every_steps",
                     "train.save_every_minutes", "train.keep_last", "train.resume", "train.progress",
                     "eval", "train.run_dir", "data.cache_dir", "train.compile",
                     "train.max_bad_steps", "train.drafter_init",  # (the checkpoint's weights win)
                     } | resumable_keys()  # train.loggers and each backend's keys (tracking/: each declares its own)
# Keys added after checkpoints were written: absent from an older checkpoint's config means this value.
ADDED_KEYS = {"data.trim_loops": False, "data.exclude_eval_prompts": False, "data.exclude_prompts": []}
OPTIM_GROUPS = "optim_groups.json"
PARTS = "trainer_state.json"


class Stateful(Protocol):
    """A part of the training state saved as JSON (counters, data position, scheduler)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier(group=None) -> None:
    if _distributed():
        dist.barrier(group=group)


def _write_json(path: Path, data) -> None:
    """A JSON file inside ``step-N.tmp``: a plain write (the folder's rename is the atomic step),
    so that a failure reaches ``save`` as an ``OSError`` and is named as the checkpoint's."""
    _write_text(path, json.dumps(data, indent=1))


def _read_json(path: Path):
    """A checkpoint's JSON file, or one line naming it (missing, unreadable, not UTF-8, corrupt)."""
    if not path.exists() and not path.is_symlink():
        raise UserFacingError(f"checkpoint file missing: {path}")
    text = read_text(path, "checkpoint file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserFacingError(f"checkpoint file corrupt: {path} ({err})") from None
    except RecursionError:
        raise UserFacingError(f"checkpoint file corrupt: {path} (nested too deeply)") from None


def _read_mapping(path: Path) -> dict:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UserFacingError(f"checkpoint file corrupt: {path} (a JSON object expected, found "
                              f"{type(data).__name__})")
    return data


SAVE_TODO = ("free space or set train.run_dir elsewhere, then continue with the same config and "
             "train.resume=auto (the earlier checkpoints are intact)")


def _save_failure(err: BaseException, final: Path) -> UserFacingError | None:
    """One line for a failed save (None: not a file-system fault, re-raise as it is). DCP wraps a
    writer's ``OSError`` (e.g. ENOSPC) in a ``CheckpointException`` holding each rank's failure."""
    if isinstance(err, CheckpointException):
        inner = [pair[0] for pair in err.failures.values() if isinstance(pair, tuple) and pair]
        err = next((e for e in inner if isinstance(e, OSError)), None)
    if isinstance(err, OSError):
        return UserFacingError(describe_os_error(err, "cannot save checkpoint", final, SAVE_TODO))
    return None


def _full_weights(drafter) -> dict:
    """Whole float32 CPU tensors; with FSDP2 every rank must call this (it all-gathers)."""
    out = {}
    for k, v in drafter.state_dict().items():
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        out[k] = v.detach().float().cpu().contiguous()
    return out


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as fh:  # inside the ``.tmp`` folder: atomic by the folder's rename
        fh.write(text)


# -- the tensors: model and optimizer through DCP ------------------------------------------------
class ModelAndOptimizer:
    """The model's weights and the optimizer's state as DCP tensors (``model.*``, ``optim.*``,
    sharded under FSDP2: every rank writes its own shards), plus the optimizer's plain
    hyperparameters (lr, betas, ...) as JSON."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def split(self) -> tuple[dict, dict]:
        """(tensors for DCP, the JSON-able optimizer hyperparameters)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(flatten_optimizer_state_dict=True))
        tensors = {f"model.{k}": v for k, v in model_sd.items()}
        tensors.update({f"optim.{k}": v for k, v in optim_sd.items() if torch.is_tensor(v)})
        groups = {k: v for k, v in optim_sd.items() if not torch.is_tensor(v)}
        return tensors, groups

    def save(self, folder: Path, group=None) -> dict:
        """Write this rank's shards under ``folder/state``; returns the hyperparameters."""
        tensors, groups = self.split()
        # With several ranks each must write its own file (the default, one file name for all
        # ranks, lets the ranks overwrite each other's share of the deduplicated tensors).
        writer = dcp.HuggingFaceStorageWriter(str(folder / "state"), save_distributed=_distributed())
        dcp.save(tensors, storage_writer=writer, process_group=group)
        return groups

    def load(self, folder: Path, group=None) -> None:
        tensors, _ = self.split()
        try:
            dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(str(folder / "state")), process_group=group)
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - any reader failure: a damaged checkpoint
            reason = [line for line in str(err).splitlines() if line.strip()][-1:] or [type(err).__name__]
            raise ValueError(f"checkpoint {folder / 'state'} is corrupt or incomplete: {reason[0].strip()}") from None
        groups = _read_json(folder / OPTIM_GROUPS)
        model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        optim_sd = {k[len("optim."):]: v for k, v in tensors.items() if k.startswith("optim.")}
        optim_sd.update({k: tuple(v) if k.endswith(".betas") else v for k, v in groups.items()})
        set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=StateDictOptions(flatten_optimizer_state_dict=True))


# -- one run's checkpoints ------------------------------------------------------------------------
class CheckpointManager:
    """One run's checkpoints: saves them (atomically, checksummed), loads one, prunes this run's
    own history, and remembers that history: the folders it wrote and the step a resume started at.

    What is saved: ``model`` and ``optimizer`` through DCP (``ModelAndOptimizer``); ``parts``, the
    other stateful parts by name (counters, data position, scheduler), as one JSON file holding
    each part's ``state_dict()``, loaded back in the dict's order; the full weights of ``drafter``
    (the unwrapped module: what ``export`` reads); ``config`` and ``drafter_config`` (plain dicts:
    saved, and compared on resume). ``step()`` names a save. Every rank of ``group`` (None: every
    rank) calls ``save`` and ``load``; rank 0 writes the shared files.

    A save is three steps kept apart so that each can be wrapped: ``_begin`` (the ``.tmp``
    folder), ``_write`` (everything into it), ``_commit`` (the rename that makes it the newest).
    """

    def __init__(self, run_dir: str | Path, *, model, optimizer, drafter, parts: dict[str, Stateful],
                 config: dict, drafter_config: dict, step: Callable[[], int], keep_last: int, group=None,
                 echo=print):
        self.run_dir = Path(run_dir)
        self.tensors = ModelAndOptimizer(model, optimizer)
        self.drafter, self.parts = drafter, parts
        self.config, self.drafter_config = config, drafter_config
        self.step, self.keep_last, self.group, self.echo = step, keep_last, group, echo
        self.written: set[str] = set()  # names of the folders this run saved (pruning may delete them)
        self.resumed_step = 0  # the step this run resumed from: checkpoints up to it are its history too

    # -- save --------------------------------------------------------------------------------
    def save(self) -> Path:
        """Save everything a resume needs as ``checkpoints/step-N`` (N: ``step()``); returns it.

        A save that fails (no space, quota, read-only, an I/O error: in DCP's writer, safetensors
        or a JSON file) removes its ``step-N.tmp`` at once and raises one line naming the
        checkpoint, ending with how to continue. The run then *stops*, it does not train on:
        every further step would be work that no checkpoint holds (and the next save would most
        likely fail the same way), so stopping with the earlier checkpoints intact loses the
        least. A ``step-N.tmp`` of a killed save is swept by the run lock at the next start."""
        final = checkpoint_dir(self.run_dir, self.step())
        tmp = final.with_name(final.name + ".tmp")
        try:
            self._begin(tmp)
            self._write(tmp)
            if _rank() == 0:
                self._commit(tmp, final)
        except BaseException as err:
            if _rank() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            explained = _save_failure(err, final)
            if explained is None:
                raise
            raise explained from None
        if _rank() == 0:
            self.written.add(final.name)
            self.prune()
        _barrier(self.group)
        return final

    def _begin(self, tmp: Path) -> None:
        """A fresh, empty ``step-N.tmp`` next to where the checkpoint will be (rank 0 makes it)."""
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier(self.group)

    def _write(self, tmp: Path) -> None:
        """Every rank's shards, then rank 0's files, checksums and, last, the COMPLETE marker."""
        groups = self.tensors.save(tmp, self.group)
        reached("checkpoint-shards")  # the shards written, the JSON files not (the kill soak aims here)
        sharded = any(hasattr(v, "full_tensor") for v in self.drafter.state_dict().values())
        weights = _full_weights(self.drafter) if _rank() == 0 or sharded else None  # FSDP2: every rank gathers
        _barrier(self.group)
        if _rank() != 0:
            return
        _write_json(tmp / OPTIM_GROUPS, groups)
        _write_json(tmp / PARTS, {name: part.state_dict() for name, part in self.parts.items()})
        _write_json(tmp / CONFIG, self.config)
        _write_json(tmp / DRAFTER_CONFIG, self.drafter_config)
        save_file(weights, str(tmp / DRAFTER_WEIGHTS))
        _write_json(tmp / CHECKSUMS, file_checksums(tmp))
        _write_text(tmp / COMPLETE, time.strftime("%Y-%m-%dT%H:%M:%S"))
        reached("checkpoint-complete")  # complete, not yet renamed into place

    def _commit(self, tmp: Path, final: Path) -> None:
        """Rename ``tmp`` to ``final``. A ``final`` already there is this run's own step N (a stop
        right after a periodic save, a finished run resumed): replaced, renamed away before the new
        one is renamed in, so one is always complete; or another history's step N (a resume from
        an older checkpoint): kept aside under a new name."""
        ours = final.name in self.written or checkpoint_step(final) <= self.resumed_step
        if final.exists() and ours:
            old = final.with_name(final.name + SET_ASIDE)  # a kill from here on: run_folder.restore_set_aside
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            reached("checkpoint-replace")  # the old step N aside, the new one not yet in place
            try:
                tmp.rename(final)
            except BaseException:
                old.rename(final)  # the old one back: it is the only complete step N
                raise
            shutil.rmtree(old)
            return
        if final.exists():
            aside = final.with_name(f"{final.name}.superseded-{time.strftime('%Y%m%d-%H%M%S')}")
            final.rename(aside)
            self.echo(f"checkpoint {final} was not written by this run: moved to {aside.name}")
        tmp.rename(final)

    def prune(self) -> None:
        """Keep the newest ``keep_last`` of this run's checkpoints (see the module docstring);
        call on rank 0."""
        step = self.step()
        ours = [p for p in complete_checkpoints(self.run_dir) if checkpoint_step(p) <= step
                and (p.name in self.written or checkpoint_step(p) <= self.resumed_step)]
        protected = summary_checkpoint(self.run_dir)
        for old in ours[:-self.keep_last]:
            if protected is None or old.resolve() != protected:
                shutil.rmtree(old, ignore_errors=True)

    # -- load --------------------------------------------------------------------------------
    def load(self, path: str | Path) -> None:
        """Restore every part from ``path`` (refused when the config differs) and record the
        step resumed from."""
        path = Path(path)
        diffs = config_differences(_read_mapping(path / CONFIG), self.config)
        diffs += config_differences(_read_mapping(path / DRAFTER_CONFIG), self.drafter_config, "drafter(resolved).")
        if diffs:
            raise ValueError(f"cannot resume from {path}: the config differs:\n  " + "\n  ".join(diffs))
        self.tensors.load(path, self.group)
        saved = _read_mapping(path / PARTS)
        missing = sorted(set(self.parts) - set(saved))
        if missing:
            raise ValueError(f"checkpoint {path / PARTS} lacks {missing}")
        for name, part in self.parts.items():
            try:
                part.load_state_dict(saved[name])
            except (KeyError, TypeError, ValueError, IndexError) as err:
                raise UserFacingError(f"checkpoint file corrupt: {path / PARTS}: entry {name!r} does not fit "
                                      f"({type(err).__name__}: {err}); resume from another checkpoint") from None
        self.resumed_step = self.step()


# -- finding the checkpoint to resume ------------------------------------------------------------
def check_run_folder(run_dir: Path, resume: str | None) -> None:
    """A fresh run (no ``train.resume``) into a folder that holds checkpoints would mix two
    runs' metrics and checkpoints: refused, with the two ways on."""
    found = complete_checkpoints(run_dir)
    if found and not resume:
        raise ValueError(f"{run_dir} already holds checkpoints ({len(found)} under checkpoints/): continue it with "
                         f"train.resume=auto, or start over with a new train.run_dir")


def resolve_resume(resume: str | None, run_dir: Path, echo=print) -> Path | None:
    """``auto`` -> newest complete checkpoint of the run whose checksums verify (None on a
    fresh run); a corrupt newer one is skipped with a message. An explicit path (a checkpoint,
    or a run folder: its newest) must verify."""
    if not resume:
        return None
    if resume == "auto":
        def fall_back(folder: Path, problem: str) -> None:
            echo(f"checkpoint {folder} is corrupt ({problem}); falling back to the previous complete one")

        try:
            return newest_verified(run_dir, on_corrupt=fall_back)
        except ValueError as err:
            raise ValueError(f"train.resume=auto: {err}") from None
    path = Path(resume)
    if not path.exists():
        raise FileNotFoundError(f"train.resume: checkpoint not found: {path}")
    if not is_complete(path):
        newest = latest_checkpoint(path)
        if newest is None:
            raise ValueError(f"{path} is not a complete checkpoint (no {COMPLETE} marker) and holds none")
        path = newest
    problem = verify_checkpoint(path)
    if problem is not None:
        raise ValueError(f"checkpoint {path} is corrupt or incomplete: {problem}; resume from an older one "
                         f"(train.resume=<its folder>) or with train.resume=auto (the newest that verifies)")
    return path


def summary_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``summary.json`` names (never pruned), if any. One whose checksum does not
    match names none (a note): the newest ``keep_last`` are kept anyway, and a damaged name must
    not protect, or stand for, another folder."""
    try:
        named = read_sealed_json(Path(run_dir) / SUMMARY, "run summary").get("checkpoint")
    except SealMismatch as err:
        note(f"dflash-train: {err}; no checkpoint is kept for its sake")
        return None
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return Path(named).resolve() if isinstance(named, str) else None


def config_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Fields that differ, except those allowed to change on resume."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        name = f"{prefix}{key}"
        if name in RESUMABLE_CHANGES or name.split(".")[0] in RESUMABLE_CHANGES:
            continue
        a, b = saved.get(key, ADDED_KEYS.get(name)), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, name + ".")
        elif _normal(a) != _normal(b):
            diffs.append(f"{name}: checkpoint {a!r} vs now {b!r}")
    return diffs


def _normal(value):
    return list(value) if isinstance(value, tuple) else value
