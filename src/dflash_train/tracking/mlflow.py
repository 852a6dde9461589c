"""MLflow (``pip install dflash-train[mlflow]``, ``train.loggers=[...,mlflow]``).

One MLflow run per training run, in experiment ``train.mlflow_experiment``, named after the
run folder; its params are the resolved job config as it started (``train.max_steps``,
``drafter.block_size``, ...: strings, JSON for anything but text), its metrics the records'
numbers at their steps. ``train.mlflow_tracking_uri`` is any store MLflow takes: a tracking
server (``http://HOST:5000``), ``sqlite:///PATH.db`` (the extra brings SQLAlchemy for it),
``databricks``; null is MLflow's own choice (``$MLFLOW_TRACKING_URI``, else
``sqlite:///mlflow.db`` in the working folder, or ``./mlruns`` where that already holds runs).
MLflow 3.18 refuses a plain-folder ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE=true``.

What a resume shows. The run id and store are kept in ``RUN/tracking.json``; a resume reopens
that run (its params stay those it started with: MLflow never changes a param). MLflow keeps
every value logged and has no way to delete one, so logging the redone steps again would
chart two values at each; instead the steps the store already holds (up to the last one
logged before the interruption) are not sent again, and every step appears once. With an
exact resume the redone steps have the values the run first logged (``metrics.jsonl`` holds
the redone ones).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from dflash_train.tracking.base import SinkUnavailable, keys_of, one_line, save_run, saved_run, scalars

DEFAULT_EXPERIMENT = "dflash-train"
PARAMS_PER_CALL = 100  # MLflow's limit on params (and tags) in one log_batch
PARAM_LENGTH = 6000  # MLflow's limit on a param value's length


@dataclass
class MlflowSettings:
    """MLflow's keys, set as ``train.mlflow_tracking_uri`` and so on (``config.TrainConfig`` inherits them)."""

    # MLflow's store: a tracking server (http://HOST:5000), sqlite:///PATH.db, databricks, ...; null:
    # $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working folder
    mlflow_tracking_uri: str | None = None
    # the MLflow experiment (null: $MLFLOW_EXPERIMENT_NAME, else dflash-train)
    mlflow_experiment: str | None = None


def _import_mlflow():
    try:
        import mlflow
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise SinkUnavailable("train.loggers: mlflow needs `pip install dflash-train[mlflow]`") from None
    return mlflow, MlflowClient


def _unavailable(uri: str, err: BaseException) -> SinkUnavailable:
    return SinkUnavailable(f"train.mlflow_tracking_uri {uri!r}: MLflow cannot use it ({one_line(err)}); set "
                           f"it to a tracking server (http://HOST:5000) or sqlite:///PATH.db")


def _open_store(settings):
    """(client, tracking URI, experiment id), or ``SinkUnavailable`` naming the key."""
    mlflow, client_class = _import_mlflow()
    uri = settings.train.mlflow_tracking_uri or mlflow.get_tracking_uri()
    name = settings.train.mlflow_experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    try:
        client = client_class(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name)
    except Exception as err:
        raise _unavailable(uri, err) from None
    return client, uri, experiment_id


def params(config: dict, prefix: str = "") -> dict[str, str]:
    """The job config as MLflow params: dotted keys, text as it is, anything else as JSON."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = (value if isinstance(value, str) else json.dumps(value))[:PARAM_LENGTH]
    return out


def _last_step(client, run_id: str) -> int:
    """The highest step of any metric the run holds (-1: none)."""
    keys = client.get_run(run_id).data.metrics
    return max((m.step for key in keys for m in client.get_metric_history(run_id, key)), default=-1)


class MlflowSink:
    name = "mlflow"
    required = False
    train_keys = MlflowSettings
    resumable = keys_of(MlflowSettings)  # where the records go, not what trains: each may change on a resume

    @staticmethod
    def check_config(train) -> None:
        """Nothing to check before the store opens (``check``)."""

    @classmethod
    def check(cls, settings) -> None:
        """The package imports, the store opens and holds (or takes) the experiment."""
        _open_store(settings)

    def __init__(self, settings):
        from mlflow.entities import Param

        self.client, uri, experiment_id = _open_store(settings)
        run_dir = Path(settings.run_dir)
        saved = saved_run(run_dir, self.name) if settings.resuming else {}
        self.held = -1  # the last step the store holds from before a resume
        self.skip_through = -1
        try:
            if saved.get("run_id") and saved.get("tracking_uri") == uri:
                self.run_id = saved["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                self.held = _last_step(self.client, self.run_id)
            else:
                self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
                items = [Param(k, v) for k, v in params(settings.config).items()]
                for start in range(0, len(items), PARAMS_PER_CALL):
                    self.client.log_batch(self.run_id, params=items[start:start + PARAMS_PER_CALL])
        except Exception as err:
            raise _unavailable(uri, err) from None
        save_run(run_dir, self.name, {"run_id": self.run_id, "experiment_id": experiment_id,
                                      "tracking_uri": uri})

    def log(self, step: int, record: dict) -> None:
        from mlflow.entities import Metric

        if step <= self.skip_through:  # the store holds this step from before the resume
            return
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def rewind(self, step: int) -> None:
        """Steps up to the last one the store holds are not sent again (see the module's docstring)."""
        self.skip_through = self.held if step < self.held else -1

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
