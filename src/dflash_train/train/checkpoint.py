"""Checkpoints that resume exactly, written atomically, loaded without unpickling.

What a checkpoint folder holds (its name and the shared file names belong to
``dflash_train.run_folder``)::

    state/                  torch.distributed.checkpoint in safetensors form (every rank
                            writes its shards): drafter weights + AdamW moments/steps
    optim_groups.json       the optimizer's non-tensor hyperparameters (lr, betas, ...)
    trainer_state.json      step/sample/token counters, data-loader position, scheduler
    rng/rank-<r>.json       RNG states of every rank (python, numpy, torch CPU/CUDA)
    config.json             the resolved job config (JSON, never pickled)
    drafter_config.json     the resolved drafter config  } what ``export`` reads
    drafter.safetensors     the full drafter weights     }
    checksums.json          sha256 and size of every file above
    COMPLETE                written last: a folder without it is never loaded

The folder is written as ``step-N.tmp`` and renamed when complete, so a crash in the
middle of a save leaves the previous checkpoint the newest loadable one. Loading
uses the safetensors-based DCP reader and JSON: no pickle anywhere.

Bytes can still rot after a save (a bad disk, a half-synced copy, a stray write): the
checksums are verified before a checkpoint is used, so ``resume=auto`` falls back to the
newest checkpoint that verifies (and says so) instead of training on garbage, and an
explicit resume path that does not verify is an error.

Pruning (``train.keep_last``) only ever deletes checkpoints of this run's own history:
those it wrote, and those at or before the step it resumed from; never one of a later
step, and never the one ``summary.json`` names.
"""

from __future__ import annotations

import json
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from dflash_train.run_folder import (
    CHECKSUMS,
    COMPLETE,
    CONFIG,
    DRAFTER_CONFIG,
    DRAFTER_WEIGHTS,
    SUMMARY,
    checkpoint_dir,
    checkpoint_step,
    complete_checkpoints,
    file_checksums,
    is_complete,
    latest_checkpoint,
    verify_checkpoint,
)

# Single-process saving/loading is intended here; DCP would warn on every call that it
# "assumes" it.
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)

# Config fields that may change on resume without changing what is being trained.
RESUMABLE_CHANGES = {"train.max_steps", "train.epochs", "train.log_every", "train.save_every_steps",
                     "train.save_every_minutes", "train.keep_last", "train.resume", "train.progress",
                     "train.tensorboard", "eval", "train.run_dir", "data.cache_dir", "train.compile",
                     "train.max_bad_steps", "train.drafter_init"}  # (the checkpoint's weights win)
# Keys added after checkpoints were written: absent from an older checkpoint's config means this value.
ADDED_KEYS = {"data.trim_loops": False, "train.distill": 0.0}


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier(group=None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def _group(trainer):
    """The drafter ranks' process group (None: all ranks); target-only ranks never save."""
    return getattr(getattr(trainer, "ranks", None), "group", None)


def _full_weights(drafter) -> dict:
    """Whole float32 CPU tensors; with FSDP2 every rank must call this (it all-gathers)."""
    out = {}
    for k, v in drafter.state_dict().items():
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        out[k] = v.detach().float().cpu().contiguous()
    return out


# -- state capture -----------------------------------------------------------------------------
def _split_state(model, optimizer):
    """Tensors (for DCP) and the JSON-able optimizer hyperparameters."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
    tensors = {f"model.{k}": v for k, v in model_sd.items()}
    tensors.update({f"optim.{k}": v for k, v in optim_sd.items() if torch.is_tensor(v)})
    groups = {k: v for k, v in optim_sd.items() if not torch.is_tensor(v)}
    return tensors, groups


def rng_state() -> dict:
    state = {
        "python": _jsonable(random.getstate()),
        "numpy": _jsonable(np.random.get_state()),
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(_tupled(state["python"]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def _jsonable(value):
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _tupled(value):
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


# -- save ------------------------------------------------------------------------------------
def save_checkpoint(trainer, run_dir: Path | None = None, keep_last: int | None = None) -> Path:
    """Save everything ``trainer`` needs to resume; every rank must call this. A run whose
    skipped non-finite steps exceed ``train.max_bad_steps`` raises here instead of saving."""
    if hasattr(trainer, "check_bad_steps"):
        trainer.check_bad_steps()
    run_dir = Path(run_dir or trainer.run_dir)
    final = checkpoint_dir(run_dir, trainer.counters.step)
    tmp = final.with_name(final.name + ".tmp")
    rank, group = _rank(), _group(trainer)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(group)
    tensors, groups = _split_state(trainer.model, trainer.optimizer)
    # With several ranks each must write its own file (the default, one file name for all
    # ranks, lets the ranks overwrite each other's share of the deduplicated tensors).
    distributed = dist.is_available() and dist.is_initialized()
    writer = dcp.HuggingFaceStorageWriter(str(tmp / "state"), save_distributed=distributed)
    dcp.save(tensors, storage_writer=writer, process_group=group)
    (tmp / "rng").mkdir(exist_ok=True)
    _write_json(tmp / "rng" / f"rank-{rank}.json", rng_state())
    sharded = any(hasattr(v, "full_tensor") for v in trainer.drafter.state_dict().values())
    weights = _full_weights(trainer.drafter) if rank == 0 or sharded else None
    _barrier(group)
    if rank == 0:
        _write_json(tmp / "optim_groups.json", groups)
        _write_json(tmp / "trainer_state.json", trainer.state_dict())
        _write_json(tmp / CONFIG, trainer.cfg.to_dict())
        _write_json(tmp / DRAFTER_CONFIG, trainer.drafter_cfg.to_dict())
        save_file(weights, str(tmp / DRAFTER_WEIGHTS))
        _write_json(tmp / CHECKSUMS, file_checksums(tmp))
        (tmp / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
        written = _written(trainer)
        ours = final.name in written or trainer.counters.step <= getattr(trainer, "resumed_step", 0)
        if final.exists() and ours:
            # this run's own step N (a stop right after a periodic save, a finished run resumed):
            # replaced, renamed away before the new one is renamed in, so one is always complete
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            if final.exists():  # another history's step N (a resume from an older checkpoint): kept aside
                aside = final.with_name(f"{final.name}.superseded-{time.strftime('%Y%m%d-%H%M%S')}")
                final.rename(aside)
                trainer.echo(f"checkpoint {final} was not written by this run: moved to {aside.name}")
            tmp.rename(final)
        written.add(final.name)
        prune(trainer, run_dir, keep_last or trainer.cfg.train.keep_last)
    _barrier(group)
    return final


def _written(trainer) -> set[str]:
    """Names of the checkpoint folders this process saved (pruning may delete those)."""
    if not hasattr(trainer, "checkpoints_written"):
        trainer.checkpoints_written = set()
    return trainer.checkpoints_written


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1))


def prune(trainer, run_dir: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` of this run's checkpoints (see the module docstring)."""
    step, resumed = trainer.counters.step, getattr(trainer, "resumed_step", 0)
    written = _written(trainer)
    ours = [p for p in complete_checkpoints(run_dir)
            if checkpoint_step(p) <= step and (p.name in written or checkpoint_step(p) <= resumed)]
    protected = summary_checkpoint(run_dir)
    for old in ours[:-keep_last]:
        if protected is None or old.resolve() != protected:
            shutil.rmtree(old, ignore_errors=True)


def summary_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``summary.json`` names (never pruned), if any."""
    try:
        named = json.loads((Path(run_dir) / SUMMARY).read_text()).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(named).resolve() if isinstance(named, str) else None


# -- load ------------------------------------------------------------------------------------
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
        candidates = complete_checkpoints(run_dir)
        for candidate in reversed(candidates):
            problem = verify_checkpoint(candidate)
            if problem is None:
                return candidate
            echo(f"checkpoint {candidate} is corrupt ({problem}); falling back to the previous complete one")
        if candidates:
            raise ValueError(f"train.resume=auto: none of the {len(candidates)} checkpoints of {run_dir} verifies")
        return None
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


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ValueError(f"checkpoint file missing: {path}") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"checkpoint file corrupt: {path} ({err})") from err


def load_checkpoint(trainer, path: Path) -> None:
    """Restore weights, optimizer, scheduler, counters, data position and RNG."""
    path = Path(path)
    saved_cfg = _read_json(path / CONFIG)
    diffs = config_differences(saved_cfg, trainer.cfg.to_dict())
    saved_drafter = _read_json(path / DRAFTER_CONFIG)
    diffs += config_differences(saved_drafter, trainer.drafter_cfg.to_dict(), "drafter(resolved).")
    if diffs:
        raise ValueError(f"cannot resume from {path}: the config differs:\n  " + "\n  ".join(diffs))
    tensors, _ = _split_state(trainer.model, trainer.optimizer)
    try:
        dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(str(path / "state")),
                 process_group=_group(trainer))
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - any reader failure: a damaged checkpoint
        reason = [line for line in str(err).splitlines() if line.strip()][-1:] or [type(err).__name__]
        raise ValueError(f"checkpoint {path / 'state'} is corrupt or incomplete: {reason[0].strip()}") from None
    groups = _read_json(path / "optim_groups.json")
    model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    optim_sd = {k[len("optim."):]: v for k, v in tensors.items() if k.startswith("optim.")}
    optim_sd.update({k: tuple(v) if k.endswith(".betas") else v for k, v in groups.items()})
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=StateDictOptions(flatten_optimizer_state_dict=True))
    state = _read_json(path / "trainer_state.json")
    trainer.load_state_dict(state)
    rng_file = path / "rng" / f"rank-{_rank()}.json"
    if rng_file.exists():
        set_rng_state(_read_json(rng_file))
    trainer.resumed_step = trainer.counters.step  # pruning may delete this history's checkpoints up to here
