"""Experiment tracking (``tracking/``): real runs logged to metrics.jsonl, TensorBoard,
wandb (offline) and MLflow (SQLite), resumed, and every backend read back with its own reader.

No network: wandb runs in offline mode and is read back from the ``.wandb`` file it writes
(``wandb leet inspect --json``, the CLI wandb ships for browsing that file); MLflow logs to a
SQLite store in the test's folder and is read back with ``MlflowClient``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict, load_config
from dflash_train.distributed.launch import run
from dflash_train.run_folder import METRICS, TENSORBOARD, TRACKING
from dflash_train.tracking import registry
from dflash_train.tracking.base import SinkSettings, SinkUnavailable, Tracking
from dflash_train.tracking.mlflow import params
from dflash_train.train import trainer as trainer_module
from dflash_train.train.loop import train
from dflash_train.train.timings import Timings

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "assets" / "smollm2"
ALL = ["jsonl", "tensorboard", "wandb", "mlflow"]

for _name in list(logging.root.manager.loggerDict):  # torch.distributed.checkpoint's per-tensor DEBUG events
    if _name.startswith("c10d-"):
        logging.getLogger(_name).setLevel(logging.INFO)


class MemorySink:
    """A fifth backend, registered by the tests alone (``BACKENDS["memory"]``): the records as the
    trainer handed them over, in process, per attempt of the run."""

    name, required = "memory", False
    attempts: list[list[tuple[int, dict]]] = []

    @classmethod
    def check(cls, settings) -> None:
        pass

    def __init__(self, settings):
        self.records = []
        MemorySink.attempts.append(self.records)

    def log(self, step, record):
        self.records.append((step, dict(record)))

    def rewind(self, step):
        pass

    def close(self):
        pass


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """wandb and MLflow kept inside the test's folder, with no network and no home-folder files."""
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(registry.BACKENDS, "memory", f"{__name__}:MemorySink")
    MemorySink.attempts = []
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def job(tmp_path: Path, uri: str, loggers=ALL, **train_overrides) -> dict:
    out = tiny_chat_job(tmp_path, loggers=list(loggers), wandb_mode="offline", mlflow_tracking_uri=uri,
                        mlflow_experiment="tests", **train_overrides)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Tell me story 3.\nTell me story 11.\n")
    out["eval"] = {"prompts": str(prompts), "num_prompts": 2, "max_new_tokens": 8}  # tau before and after
    return out


class Crash(Exception):
    pass


def crash_when_step_starts(monkeypatch, step: int) -> dict:
    """The run dies as step ``step`` starts (the steps before it logged, not all saved) until
    the returned switch's ``"at"`` is set to None."""
    original, switch = trainer_module.Trainer.train_step, {"at": step}

    def crashing(self, micro_batches):
        if self.counters.step + 1 == switch["at"]:
            raise Crash(f"killed at step {switch['at']}")
        return original(self, micro_batches)

    monkeypatch.setattr(trainer_module.Trainer, "train_step", crashing)
    return switch


# -- reading each backend back with its own reader -------------------------------------------------
def by_step(pairs) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for step, value in pairs:
        out.setdefault(int(step), []).append(value)
    return out


def once(series: dict[int, list[float]]) -> dict[int, float]:
    """``{step: value}`` of a series that holds each step once (asserted)."""
    assert all(len(values) == 1 for values in series.values()), f"a step logged twice: {series}"
    return {step: values[0] for step, values in series.items()}


def jsonl_series(run_dir: Path, key: str) -> dict[int, list[float]]:
    rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]
    return by_step((r["step"], r[key]) for r in rows if key in r)


def tensorboard_series(run_dir: Path, key: str) -> dict[int, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / TENSORBOARD))
    events.Reload()
    return by_step((e.step, e.value) for e in events.Scalars(key)) if key in events.Tags()["scalars"] else {}


def wandb_runs(run_dir: Path) -> list[dict]:
    """Every offline run folder under RUN/wandb: its run id, config and history rows by step."""
    out = []
    for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        lines = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                               capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        run = next(r["run"] for r in records if r.get("type") == "run")
        history = [r["history"] for r in records if r.get("type") == "history"]
        out.append({"id": run["run_id"], "config": run.get("config", {}).get("update", {}),
                    "rows": [(int(h["step"]["num"]), h["item"]) for h in history]})
    return out


def wandb_series(runs: list[dict], key: str) -> dict[int, list[float]]:
    """A metric of ``wandb_runs``'s history rows, by step."""
    return by_step((step, item[key]) for run in runs for step, item in run["rows"] if key in item)


def mlflow_series(uri: str, run_id: str, key: str) -> dict[int, list[float]]:
    from mlflow.tracking import MlflowClient

    return by_step((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


# -- the done-when: four sinks, a crash, a resume, the same losses read back from each -----------
def test_every_backend_holds_each_steps_loss_once_across_a_resume(tmp_path, offline, monkeypatch):
    uri, loggers = offline, [*ALL, "memory"]
    first = job(tmp_path, uri, loggers, max_steps=8, save_every_steps=3)
    crash = crash_when_step_starts(monkeypatch, 6)  # logged 1..5, saved at 3: the resume redoes 4 and 5
    with pytest.raises(Crash):
        train(config_from_dict(first), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None,
              timings=Timings(torch.device("cpu")))
    crash["at"] = None
    resumed = job(tmp_path, uri, loggers, max_steps=8, save_every_steps=3, resume="auto")
    summary = train(config_from_dict(resumed), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None,
                    timings=Timings(torch.device("cpu")))
    assert summary["steps"] == 8 and summary["tau_after"] >= 1

    run_dir = tmp_path / "run"
    before, after = ({s: r["loss"] for s, r in attempt if "loss" in r} for attempt in MemorySink.attempts)
    assert sorted(before) == [1, 2, 3, 4, 5] and sorted(after) == [4, 5, 6, 7, 8]
    for step in (4, 5):  # an exact resume: the redone steps' losses are the first attempt's
        assert after[step] == pytest.approx(before[step], rel=1e-5)
    redone = {s: [v] for s, v in {**before, **after}.items()}  # each step's newest value
    first_sent = {s: [v] for s, v in {**after, **before}.items()}  # each step's first value

    ids = json.loads((run_dir / TRACKING).read_text())
    mlflow_id = ids["mlflow"]["run_id"]
    assert jsonl_series(run_dir, "loss") == redone  # metrics.jsonl: rewound to 3, then 4..8 again
    # TensorBoard stores float32; purge_step hides the interrupted attempt's 4 and 5
    assert once(tensorboard_series(run_dir, "loss")) == pytest.approx(once(redone))
    # wandb and MLflow keep what they were sent: 1..5 from the first attempt, 6..8 from the resume, once each
    runs = wandb_runs(run_dir)
    assert wandb_series(runs, "loss") == first_sent
    assert mlflow_series(uri, mlflow_id, "loss") == first_sent
    assert once(first_sent) == pytest.approx(once(redone), rel=1e-5)  # all four agree

    # held-out tau and the per-role seconds are fields of the records every backend got
    taus = {s: [r["tau"]] for attempt in MemorySink.attempts for s, r in attempt if "tau" in r}
    assert sorted(taus) == [0, 8]  # before training (first attempt) and after it (the resume)
    for series in (jsonl_series(run_dir, "tau"), wandb_series(runs, "tau"), mlflow_series(uri, mlflow_id, "tau")):
        assert series == taus
    assert once(tensorboard_series(run_dir, "tau")) == pytest.approx(once(taus))
    for series in (jsonl_series(run_dir, "drafter_compute_s"), tensorboard_series(run_dir, "drafter_compute_s"),
                   wandb_series(runs, "drafter_compute_s"), mlflow_series(uri, mlflow_id, "drafter_compute_s")):
        assert sorted(once(series)) == list(range(1, 9))

    # the resume continued the same tracked runs
    assert len(runs) == 2 and {r["id"] for r in runs} == {ids["wandb"]["id"]}  # offline: a folder per attempt
    config = runs[0]["config"]
    assert config["drafter"]["block_size"] == 4 and config["train"]["max_steps"] == 8
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tests")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [mlflow_id]
    mlflow_run = client.get_run(mlflow_id)
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.info.run_name == "run"
    assert mlflow_run.data.params == params(config_from_dict(first).to_dict())  # the config it started with
    assert mlflow_run.data.params["drafter.block_size"] == "4" and mlflow_run.data.params["train.resume"] == "null"
    assert mlflow_run.data.params["train.loggers"] == json.dumps(loggers)



# -- the fan-out: the record is required, the mirrors are not ------------------------------------
class Flaky:
    """A sink that raises from its ``fail_at`` step on (in ``log``), or in ``close``."""

    def __init__(self, name, required=False, fail_at=None, fail_close=False):
        self.name, self.required, self.fail_at, self.fail_close = name, required, fail_at, fail_close
        self.logged, self.closed = [], 0

    def log(self, step, record):
        if self.fail_at is not None and step >= self.fail_at:
            raise OSError(f"{self.name} server gone\n(second line)")
        self.logged.append(step)

    def rewind(self, step):
        pass

    def close(self):
        self.closed += 1
        if self.fail_close:
            raise RuntimeError("cannot close")


def test_a_failing_mirror_is_dropped_with_one_warning_and_the_others_go_on():
    said = []
    record, mirror, other = Flaky("jsonl", required=True), Flaky("wandb", fail_at=2), Flaky("mlflow", fail_close=True)
    tracking = Tracking([record, mirror, other], warn=said.append)
    for step in range(1, 5):
        tracking.log(step, {"loss": 1.0})
    assert record.logged == other.logged == [1, 2, 3, 4] and mirror.logged == [1]
    assert tracking.names == ["jsonl", "mlflow"] and mirror.closed == 1
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("warning: train.loggers: wandb failed to log step 2 (wandb server gone (second line))")
    tracking.close()
    tracking.close()  # once only
    assert record.closed == other.closed == 1 and len(said) == 2 and "mlflow failed to close" in said[1]


def test_a_failing_record_stops_the_run():
    tracking = Tracking([Flaky("jsonl", required=True, fail_at=3), Flaky("wandb")], warn=print)
    tracking.log(2, {})
    with pytest.raises(OSError, match="jsonl server gone"):
        tracking.log(3, {})


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow"])
def test_a_backend_failing_mid_run_is_a_warning_and_training_finishes(tmp_path, offline, monkeypatch, name):
    """The backend's ``log`` raises from step 3 on (a full disk, a server gone): one warning line,
    every step in metrics.jsonl, the backend holds the steps before the failure."""
    sink = registry.backend(name)
    original = sink.log

    def failing(self, step, record):
        if step >= 3:
            raise ConnectionError(f"{name} is unreachable")
        original(self, step, record)

    monkeypatch.setattr(sink, "log", failing)
    said = []
    cfg = config_from_dict({**job(tmp_path, offline, ["jsonl", name], max_steps=5), "eval": {}})
    summary = train(cfg, target=tiny_chat_target(SMOLLM2), echo=said.append)
    assert summary["steps"] == 5
    warnings = [line for line in said if line.startswith("warning:")]
    assert warnings == [f"warning: train.loggers: {name} failed to log step 3 ({name} is unreachable); it is "
                        f"dropped and training goes on (metrics.jsonl keeps every record)"]
    run_dir = tmp_path / "run"
    assert sorted(once(jsonl_series(run_dir, "loss"))) == [1, 2, 3, 4, 5]
    if name == "tensorboard":
        held = once(tensorboard_series(run_dir, "loss"))
    elif name == "wandb":
        held = once(wandb_series(wandb_runs(run_dir), "loss"))
    else:
        held = once(mlflow_series(offline, json.loads((run_dir / TRACKING).read_text())["mlflow"]["run_id"], "loss"))
    assert sorted(held) == [1, 2]


# -- a backend that cannot start: one line naming the key, before the target loads --------------
@pytest.fixture
def weights_must_not_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the target's weights were loaded before the loggers were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def _missing(module: str):
    def install(monkeypatch, tmp_path):
        monkeypatch.setitem(sys.modules, module, None)  # ``import module`` raises ImportError
        return [f"train.loggers=[{module}]"]
    return install


def _setting(*overrides: str):
    def install(monkeypatch, tmp_path):
        (tmp_path / "a-file").write_text("")
        return [o.replace("TMP", str(tmp_path)) for o in overrides]
    return install


@pytest.mark.parametrize("entry", ["train", "launch"])
@pytest.mark.parametrize(("install", "message"), [
    (_missing("wandb"), "train.loggers: wandb needs `pip install dflash-train[wandb]`"),
    (_missing("mlflow"), "train.loggers: mlflow needs `pip install dflash-train[mlflow]`"),
    (_setting("train.loggers=[mlflow]", "train.mlflow_tracking_uri=bogus://nowhere"),
     "train.mlflow_tracking_uri 'bogus://nowhere': MLflow cannot use it (Model registry functionality is unavailable"),
    (_setting("train.loggers=[mlflow]", "train.mlflow_tracking_uri=sqlite:///TMP/a-file/mlflow.db"),
     "train.mlflow_tracking_uri 'sqlite:///"),
    (_setting("train.loggers=[jsonl,wandb]", "train.wandb_dir=TMP/a-file/wandb"),
     "train.wandb_dir TMP/a-file/wandb: cannot write there (Not a directory)"),
], ids=["no-wandb", "no-mlflow", "bad-uri", "unwritable-store", "unwritable-wandb-dir"])
def test_a_backend_that_cannot_start_is_one_line_before_the_target_loads(
        tmp_path, offline, monkeypatch, weights_must_not_load, entry, install, message):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    overrides = install(monkeypatch, tmp_path)
    data = tiny_chat_job(tmp_path)
    data["target"]["path"] = str(SMOLLM2)
    for item in overrides:
        key, value = item.split("=", 1)
        data["train"][key.split(".")[1]] = yaml.safe_load(value)
    cfg = config_from_dict(data)
    with pytest.raises(SinkUnavailable) as err:
        train(cfg) if entry == "train" else run(cfg)
    text = str(err.value)
    assert "\n" not in text and text.startswith(message.replace("TMP", str(tmp_path))), text
    assert not (tmp_path / "run" / TRACKING).exists()


def test_an_unknown_logger_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"^train\.loggers: unknown logger 'neptune'; known: jsonl, mlflow, "
                                         r"tensorboard, wandb$"):
        load_config("cpu-demo", ["train.loggers=[jsonl,neptune]"])
    with pytest.raises(ValueError, match=r"train\.tensorboard is now train\.loggers"):
        load_config("cpu-demo", ["train.tensorboard=false"])


def test_jsonl_is_always_on_and_first():
    assert registry.selected(["wandb", "tensorboard"]) == ["jsonl", "wandb", "tensorboard"]
    assert registry.selected(["mlflow", "jsonl"]) == ["jsonl", "mlflow"]
    assert registry.selected([]) == ["jsonl"]


def test_every_backend_is_a_sink(tmp_path):
    """What the fan-out calls, on every registered backend (a fifth must have it too)."""
    for name in registry.BACKENDS:
        cls = registry.backend(name)
        assert cls.name == name and isinstance(cls.required, bool)
        assert all(callable(getattr(cls, method, None)) for method in ("check", "log", "rewind", "close"))
    assert [name for name in registry.BACKENDS if registry.backend(name).required] == ["jsonl"]
    settings = SinkSettings(tmp_path)
    opened = registry.open_tracking(settings)
    assert opened.names == ["jsonl", "tensorboard"]  # the default train.loggers
    opened.close()


def test_each_backend_declares_its_resume_rules_and_checks_its_own_keys():
    """config.py and train/checkpoint.py ask the backends (issue 59 item 4): a backend's keys that may
    change on a resume, and its keys' check when a config is read, live in its own module."""
    from dflash_train.train.checkpoint import RESUMABLE_CHANGES

    for name in registry.BACKENDS:
        cls = registry.backend(name)
        assert all(key.startswith("train.") for key in cls.resumable) and callable(cls.check_config)
        assert set(cls.resumable) <= RESUMABLE_CHANGES
    assert registry.resumable_keys() == {
        "train.loggers", "train.tensorboard", "train.wandb_project", "train.wandb_entity", "train.wandb_mode",
        "train.wandb_dir", "train.mlflow_tracking_uri", "train.mlflow_experiment"}
    with pytest.raises(ValueError, match="train.wandb_mode must be online, offline, disabled or null"):
        load_config("cpu-demo", ["train.wandb_mode=bogus"])  # wandb's own check, wandb listed or not
    code = ("import sys; from dflash_train.config import load_config; load_config('cpu-demo', []); "
            "assert not {'wandb', 'mlflow'} & set(sys.modules), 'an optional package was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
