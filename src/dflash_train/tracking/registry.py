"""The backends by name (``train.loggers``), their keys as one settings base, and opening the ones a job names.

Names map to ``module:Class`` strings. Each backend declares, in its own module, what ``config.py``
and ``train/checkpoint.py`` ask of it: ``train_keys`` (its own config keys: a dataclass of fields
named ``<backend>_...``, with their defaults and their meanings as comments), ``check_config(train)``
(their values, when a config is read) and ``resumable`` (its keys that may change on a resume).
``TrackingSettings`` joins every backend's ``train_keys`` into one dataclass, and
``config.TrainConfig`` inherits it: the keys stay flat (``train.wandb_mode``), and docs/config.md
documents them from the backend's comments. Building it imports every backend module, so those
import no optional package (``wandb``, ``mlflow``) until a backend is checked or opened. A fifth
backend is one module in this package, one line here, and its tests (and its package an extra in
pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import importlib

BACKENDS = {
    "jsonl": "dflash_train.tracking.jsonl:JsonlSink",
    "tensorboard": "dflash_train.tracking.tensorboard:TensorBoardSink",
    "wandb": "dflash_train.tracking.wandb:WandbSink",
    "mlflow": "dflash_train.tracking.mlflow:MlflowSink",
}
RECORD = "jsonl"  # metrics.jsonl: always on (resume and the summary read it), listed or not
DEFAULT_LOGGERS = ("jsonl", "tensorboard")  # train.loggers' default (config.py)


def _train_keys() -> list[type]:
    """Every backend's ``train_keys`` dataclass, in ``BACKENDS`` order; a key must start with its
    backend's name (``wandb_``) so that no backend can shadow a training key or another backend's."""
    found = []
    for name in BACKENDS:
        keys = backend(name).train_keys
        if keys is None:
            continue
        stray = [f.name for f in dataclasses.fields(keys) if not f.name.startswith(f"{name}_")]
        if stray:
            raise ValueError(f"tracking backend {name}: its keys must start with {name}_, got {stray}")
        found.append(keys)
    return found


def _tracking_settings() -> type:
    """One dataclass holding every backend's keys, ``config.TrainConfig``'s base. A dataclass lists
    its bases' fields base-most first (its MRO reversed), so the bases go in reverse to list the
    backends' keys in ``BACKENDS`` order."""
    bases = tuple(reversed(_train_keys()))
    doc = "Every tracking backend's own keys (registry.BACKENDS' train_keys), which config.TrainConfig inherits."
    return dataclasses.dataclass(type("TrackingSettings", bases, {"__doc__": doc}))


def check_names(loggers) -> None:
    """``train.loggers`` is a list of known names, each once; else a ``ValueError`` naming the key."""
    if not isinstance(loggers, list | tuple) or not all(isinstance(name, str) for name in loggers):
        raise ValueError(f"train.loggers must be a list of names, e.g. [jsonl, tensorboard, wandb], "
                         f"got {loggers!r}")
    for name in loggers:
        if name not in BACKENDS:
            raise ValueError(f"train.loggers: unknown logger {name!r}; known: {', '.join(sorted(BACKENDS))}")
        if list(loggers).count(name) > 1:
            raise ValueError(f"train.loggers: {name!r} is listed twice")


def selected(loggers) -> list[str]:
    """The names a job logs to, in order: ``jsonl`` first (added when left out), then the rest."""
    return [RECORD] + [name for name in loggers if name != RECORD]


def _loggers(settings) -> list[str]:
    return list(DEFAULT_LOGGERS) if settings.train is None else settings.train.loggers


def backend(name: str) -> type:
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


TrackingSettings = _tracking_settings()


def check_config(train) -> None:
    """What ``config.TrainConfig`` checks of ``train.loggers`` and of every backend's keys (each
    backend's ``check_config``, listed or not): a ``ValueError`` naming the key."""
    check_names(train.loggers)
    for name in BACKENDS:
        backend(name).check_config(train)


def resumable_keys() -> set[str]:
    """The config keys of tracking that may change on a resume (``train/checkpoint.py``): where the
    records go, never what trains. ``train.tensorboard``: ``train.loggers``' predecessor, in older
    checkpoints' configs."""
    return {"train.loggers", "train.tensorboard"} | {key for name in BACKENDS for key in backend(name).resumable}


def check_loggers(settings) -> None:
    """Every selected backend's ``check`` (a ``SinkUnavailable`` line for the first that cannot
    start): what ``torchrun`` jobs run on rank 0 before any rank loads the target."""
    for name in selected(_loggers(settings)):
        backend(name).check(settings)


def open_tracking(settings, warn=print):
    """Check and open every selected backend (``base.SinkSettings``): the fan-out of their sinks.
    One that cannot start is a ``SinkUnavailable`` line, the ones opened before it closed again."""
    from dflash_train.tracking.base import Tracking

    opened = Tracking([], warn)
    try:
        for name in selected(_loggers(settings)):
            cls = backend(name)
            cls.check(settings)
            opened.sinks.append(cls(settings))
    except BaseException:
        opened.close()
        raise
    return opened
