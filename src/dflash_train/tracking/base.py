"""The sink seam: every record the trainer logs goes to a list of sinks, one per backend.

A record is one dict per logged step, built whole by the trainer: a training window's loss,
accuracy, learning rate and per-role seconds (``target_forward_s``, ...), or a held-out
evaluation's ``tau``. A backend never reaches into the trainer, and nothing outside this
package asks which backends there are.

A backend is a class (named in ``registry.BACKENDS``) whose objects are sinks:

* ``check(settings)`` (a classmethod): what can fail before anything starts (the package is
  missing, a folder cannot be written, a tracking URI is wrong), raised as ``SinkUnavailable``,
  one line naming the key; it runs before the target model loads;
* ``Backend(settings)`` opens it (starts or reopens the tracked run);
* ``log(step, record)``, ``rewind(step)`` (a resume from the checkpoint of ``step``: what was
  logged after it must not stay, or must not be sent twice) and ``close()``;
* ``train_keys``: its own config keys as a dataclass in its module (``wandb.WandbSettings``), or
  None; ``config.TrainConfig`` inherits them (``registry.TrackingSettings``), so they are set as
  ``train.wandb_mode``. ``check_config(train)`` checks their values, ``resumable`` names those a
  resume may change (``keys_of``).

``metrics.jsonl`` is the run's record (the resume, ``summary.json`` and ``dflash-train curve``
read it), so its sink is ``required``: a failed write stops the run in one line, as before.
Every other sink mirrors it: one that raises mid-run is dropped with one warning line and
training goes on.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from dflash_train.files import (
    SealMismatch,
    UserFacingError,
    atomic_write_text,
    note,
    read_sealed_json,
    seal_json,
    unwritable,
)
from dflash_train.run_folder import METRICS, TRACKING, WRITE_TODO


class SinkUnavailable(UserFacingError):
    """A backend cannot start: one line naming the config key (the CLI prints it as it is)."""


@dataclass(frozen=True)
class SinkSettings:
    """What a backend is checked and opened with."""

    run_dir: Path
    # the job's config.TrainConfig (train.loggers, each backend's own keys: its train_keys, train.wandb_*, ...);
    # None: the defaults (registry.DEFAULT_LOGGERS). Typed loosely: config.py sits above this package
    train: Any = None
    config: dict = field(default_factory=dict)  # the resolved job config: wandb's config, MLflow's params
    resuming: bool = False  # continue the tracked run named in tracking.json instead of starting one

    @classmethod
    def of_job(cls, cfg, resuming: bool) -> SinkSettings:
        """The settings of a job (``config.JobConfig``)."""
        return cls(Path(cfg.train.run_dir), cfg.train, cfg.to_dict(), resuming)


class Sink(Protocol):
    name: str  # its name in train.loggers (warnings say which one failed)
    required: bool  # True: a failure stops the run; False: a warning, the sink is dropped

    def log(self, step: int, record: dict) -> None: ...

    def rewind(self, step: int) -> None: ...

    def close(self) -> None: ...


def keys_of(train_keys: type) -> tuple[str, ...]:
    """A backend's ``train_keys`` dataclass as the dotted keys a user writes: ``("train.wandb_mode", ...)``."""
    return tuple(f"train.{f.name}" for f in fields(train_keys))


def one_line(err: BaseException, limit: int = 240) -> str:
    """An exception as a short single line (libraries' messages run over several lines)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Tracking:
    """The fan-out: each record to every sink, in order (``metrics.jsonl`` first).

    A failure of a ``required`` sink propagates (the run stops, its last checkpoint intact);
    any other sink that raises is closed, dropped and named in one ``warn`` line, and the
    others go on. Ranks other than the main one hold no sinks: their ``log`` does nothing.
    """

    def __init__(self, sinks: list[Sink] = (), warn=print):
        self.sinks = list(sinks)
        self.warn = warn

    @property
    def names(self) -> list[str]:
        return [sink.name for sink in self.sinks]

    def log(self, step: int, record: dict) -> None:
        for sink in list(self.sinks):
            self._call(sink, f"log step {step}", sink.log, step, record)

    def rewind(self, step: int) -> None:
        for sink in list(self.sinks):
            self._call(sink, f"rewind to step {step}", sink.rewind, step)

    def close(self) -> None:
        """Close every sink once (later calls do nothing)."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            self._call(sink, "close", sink.close)

    def _call(self, sink: Sink, what: str, method, *args) -> None:
        try:
            method(*args)
        except Exception as err:
            if sink.required:
                raise
            if sink in self.sinks:
                self.sinks.remove(sink)
                with contextlib.suppress(Exception):  # a broken backend: its close may fail too
                    sink.close()
            self.warn(f"warning: train.loggers: {sink.name} failed to {what} ({one_line(err)}); it is "
                      f"dropped and training goes on ({METRICS} keeps every record)")


def scalars(record: dict) -> dict[str, float]:
    """The record's numbers as the mirrors (TensorBoard, wandb, MLflow) chart them: every finite
    int or float field but ``step``, and ``accuracy`` (one value per block position) as
    ``accuracy/pos1``, ``accuracy/pos2``, ... A NaN or inf (the loss of a window of skipped
    steps) is left out: ``metrics.jsonl`` keeps it."""
    out = {}
    for key, value in record.items():
        if (key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value)):
            out[key] = value
    for k, acc in enumerate(record.get("accuracy") or [], start=1):
        if isinstance(acc, int | float) and math.isfinite(acc):
            out[f"accuracy/pos{k}"] = acc
    return out


# -- tracking.json: the tracked runs' ids, so that a resume continues them ----------------------
def _tracking_ids(path: Path, echo=None) -> dict:
    """``RUN/tracking.json``'s object, its checksum verified ({} when missing or unreadable). A
    changed byte that still parses could be another tracked run's id, and a resume would then
    write into that run: a mismatch is a note and a new tracked run instead."""
    try:
        data = read_sealed_json(path, "tracking ids", echo)
    except SealMismatch as err:
        (echo or note)(f"dflash-train: {err}; the tracking backends start new runs")
        return {}
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def saved_run(run_dir: Path, name: str) -> dict:
    """Backend ``name``'s entry in ``RUN/tracking.json`` ({} when there is none, or the file is
    unreadable or fails its checksum: the backend then starts a new tracked run)."""
    entry = _tracking_ids(Path(run_dir) / TRACKING).get(name)
    return entry if isinstance(entry, dict) else {}


def save_run(run_dir: Path, name: str, entry: dict) -> None:
    """Replace backend ``name``'s entry in ``RUN/tracking.json`` (atomically: the others kept),
    with its checksum (``files.seal_json``)."""
    path = Path(run_dir) / TRACKING
    data = _tracking_ids(path, echo=lambda line: None)  # saved_run said it already
    data[name] = entry
    atomic_write_text(path, seal_json(data, indent=1), "tracking ids", WRITE_TODO)


def writable_folder(folder: Path, key: str) -> Path:
    """``folder`` exists and takes a file, or ``SinkUnavailable`` naming ``key``."""
    folder = Path(folder)
    reason = unwritable(folder)
    if reason is not None:
        raise SinkUnavailable(f"{key} {folder}: cannot write there ({reason})")
    return folder
