"""Experiment tracking under torchrun: only rank 0 logs, to every backend (CPU/gloo, 2 ranks)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_helpers import metrics, worker  # noqa: E402

from dflash_train.run_folder import TENSORBOARD  # noqa: E402


def test_only_rank_zero_logs(tmp_path):
    """Were every rank to log, metrics.jsonl would hold each step twice, TensorBoard would have two
    writers' files, wandb two runs and MLflow two runs."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    home = str(tmp_path / "wandb-home")
    rc, out, err, _ = worker(2, tmp_path, "0", "0", "1", "4", "train.loggers=[jsonl,tensorboard,wandb,mlflow]",
                             "train.wandb_mode=offline", f"train.mlflow_tracking_uri={uri}",
                             "train.mlflow_experiment=dist", WANDB_SILENT="true", WANDB_CONFIG_DIR=home,
                             WANDB_CACHE_DIR=home, WANDB_DATA_DIR=home)
    assert rc == 0, err[-4000:]
    assert out.count("EXITED rank") == 2, out[-2000:]
    run = tmp_path / "run"
    assert [r["step"] for r in metrics(run) if "loss" in r] == [1, 2, 3, 4]
    writers = {p.name.split(".")[-2] for p in (run / TENSORBOARD).iterdir()}  # events.out.tfevents.T.HOST.PID.N
    assert len(writers) == 1, sorted(p.name for p in (run / TENSORBOARD).iterdir())
    assert len(list(run.glob("wandb/offline-run-*"))) == 1
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("dist").experiment_id])
    assert len(runs) == 1
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")] == [1, 2, 3, 4]
