"""Weights & Biases (``pip install dflash-train[wandb]``, ``train.loggers=[...,wandb]``).

One wandb run per training run: its config is the resolved job config, its name the run
folder's, and its id is kept in ``RUN/tracking.json`` so that a resume continues it
(``resume="allow"``). ``train.wandb_mode=offline`` writes under ``RUN/wandb/`` (or
``train.wandb_dir``) with no network, for ``wandb sync`` to upload later; an offline resume
writes a second folder with the same run id (``offline-run-<time>-<id>-1`` with wandb 0.31).

What a resume shows. wandb keeps a run's history and refuses a step lower than the last one
it holds, so nothing logged can be taken back: the steps an interrupted run logged after its
last checkpoint stay as they were, and when they are trained again they are not sent a
second time (the sink remembers the last step it sent, in ``tracking.json``). Every step
appears once; with an exact resume the redone steps have the values the run first logged
(``metrics.jsonl`` holds the redone ones). wandb's console capture is off: ``metrics.jsonl``
and the terminal are the record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dflash_train.tracking.base import (
    SinkUnavailable,
    keys_of,
    one_line,
    save_run,
    saved_run,
    scalars,
    writable_folder,
)

DEFAULT_PROJECT = "dflash-train"


@dataclass
class WandbSettings:
    """wandb's keys, set as ``train.wandb_project`` and so on (``config.TrainConfig`` inherits them)."""

    wandb_project: str | None = None  # the wandb project (null: $WANDB_PROJECT, else dflash-train)
    wandb_entity: str | None = None  # the wandb team or user (null: your default entity)
    # online, offline (no network; `wandb sync` uploads later) or disabled; null: $WANDB_MODE, else online
    wandb_mode: str | None = None
    wandb_dir: str | None = None  # where wandb writes its run folders (null: the run folder, RUN/wandb/)


def _import_wandb():
    try:
        import wandb
    except ImportError:
        raise SinkUnavailable("train.loggers: wandb needs `pip install dflash-train[wandb]`") from None
    return wandb


def _folder(settings) -> Path:
    return Path(settings.train.wandb_dir) if settings.train.wandb_dir else Path(settings.run_dir)


MODES = (None, "online", "offline", "disabled")


class WandbSink:
    name = "wandb"
    required = False
    train_keys = WandbSettings
    resumable = keys_of(WandbSettings)  # where the records go, not what trains: each may change on a resume

    @staticmethod
    def check_config(train) -> None:
        """Its keys' values, when the config is read (whether or not ``train.loggers`` lists wandb)."""
        if train.wandb_mode not in MODES:
            raise ValueError(f"train.wandb_mode must be online, offline, disabled or null, "
                             f"got {train.wandb_mode!r}")

    @classmethod
    def check(cls, settings) -> None:
        """The package imports and its folder takes files (a login problem shows when the run
        starts, on the main rank, in one line too)."""
        _import_wandb()
        writable_folder(_folder(settings), "train.wandb_dir")

    def __init__(self, settings):
        wandb = _import_wandb()
        t, self.run_dir = settings.train, Path(settings.run_dir)
        saved = saved_run(self.run_dir, self.name) if settings.resuming else {}
        self.sent = saved.get("last_step", -1) if saved.get("id") else -1  # the last step wandb holds
        self.skip_through = -1
        project = t.wandb_project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        again = saved.get("id")  # continue this wandb run (its config stays the one it started with)
        config = None if again else settings.config
        try:
            self.run = wandb.init(project=project, entity=t.wandb_entity, mode=t.wandb_mode,
                                  dir=str(_folder(settings)), name=self.run_dir.name, id=again,
                                  resume="allow" if again else None, config=config,
                                  settings=wandb.Settings(console="off"))
        except Exception as err:
            raise SinkUnavailable(f"train.loggers: wandb cannot start a run ({one_line(err)}); log in with "
                                  f"`wandb login`, or set train.wandb_mode=offline") from None
        self._save()

    def _save(self) -> None:
        save_run(self.run_dir, self.name, {"id": self.run.id, "last_step": self.sent})

    def log(self, step: int, record: dict) -> None:
        if step <= self.skip_through:  # wandb holds this step from before the resume
            return
        values = scalars(record)
        if values:
            self.run.log(values, step=step)
        if step > self.sent:
            self.sent = step
            self._save()

    def rewind(self, step: int) -> None:
        """Steps up to the last one wandb holds are not sent again (see the module's docstring)."""
        self.skip_through = self.sent if step < self.sent else -1

    def close(self) -> None:
        self.run.finish()
