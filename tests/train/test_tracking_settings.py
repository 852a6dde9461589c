"""A logging backend's own keys live in its module (issue 59 item 4): ``config.TrainConfig`` inherits
them through ``tracking.registry.TrackingSettings``, so a fifth backend is its module and one line in
``registry.BACKENDS``, with no edit to config.py."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import subprocess
import sys
import textwrap

import pytest

from dflash_train import config
from dflash_train.config import TrainConfig
from dflash_train.tracking import registry

# A fifth backend as its own module would be: its keys (a dataclass, meanings as comments) and its sink.
FAKE_BACKEND = '''
from __future__ import annotations

from dataclasses import dataclass

from dflash_train.tracking.base import keys_of


@dataclass
class FakeSettings:
    fake_level: int = 3  # how loud the fake backend is
    # where the fake backend writes
    fake_place: str | None = None


@dataclass
class StraySettings:
    seed: int = 1  # would shadow train.seed


class FakeSink:
    name = "fake"
    required = False
    train_keys = FakeSettings
    resumable = keys_of(FakeSettings)

    @staticmethod
    def check_config(train) -> None:
        if train.fake_level < 0:
            raise ValueError(f"train.fake_level must be >= 0, got {train.fake_level}")


class StraySink(FakeSink):
    name = "stray"
    train_keys = StraySettings
'''

# In a fresh process: the registry line a fifth backend adds, then what importing registry builds from it.
REGISTER_AND_READ = '''
import dataclasses, json, sys
sys.path.insert(0, {folder!r})
from dflash_train.tracking import registry
registry.BACKENDS["fake"] = "fake_backend:FakeSink"
registry.TrackingSettings = registry._tracking_settings()
from dflash_train import config_reference
from dflash_train.config import TrainConfig, load_config
try:
    load_config("cpu-demo", ["train.fake_level=-1"])
    refused = ""
except ValueError as err:
    refused = str(err)
rows = [line for line in config_reference.render_markdown().splitlines() if "`train.fake_" in line]
print(json.dumps({{"keys": [f.name for f in dataclasses.fields(TrainConfig)],
                   "level": load_config("cpu-demo", ["train.fake_level=5"]).train.fake_level,
                   "saved": load_config("cpu-demo", []).to_dict()["train"]["fake_place"],
                   "refused": refused, "rows": rows, "resumable": sorted(registry.resumable_keys())}}))
'''


def test_a_fifth_backend_is_its_module_and_one_registry_line(tmp_path):
    """Its keys become ``train.fake_*``: set by an override, checked, saved, resumable, documented
    from its own comments, listed after the other backends' keys; config.py is not edited."""
    (tmp_path / "fake_backend.py").write_text(FAKE_BACKEND)
    code = REGISTER_AND_READ.format(folder=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    keys = got["keys"]
    assert keys[keys.index("mlflow_experiment") + 1:keys.index("progress")] == ["fake_level", "fake_place"]
    assert got["level"] == 5 and got["saved"] is None
    assert got["refused"] == "train.fake_level must be >= 0, got -1"
    assert {"train.fake_level", "train.fake_place"} <= set(got["resumable"])
    assert got["rows"] == ["| `train.fake_level` | `int` | `3` | how loud the fake backend is |",
                           "| `train.fake_place` | `str \\| None` | `null` | where the fake backend writes |"]


def test_a_backend_key_must_carry_its_backend_name(tmp_path, monkeypatch):
    """``seed`` from a backend would silently shadow ``train.seed``: the registry refuses it."""
    (tmp_path / "fake_backend.py").write_text(FAKE_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.BACKENDS, "stray", "fake_backend:StraySink")
    with pytest.raises(ValueError, match=re.escape("tracking backend stray: its keys must start with stray_, "
                                                   "got ['seed']")):
        registry._tracking_settings()


def test_every_backend_key_is_declared_once_in_its_module_and_not_in_config_py():
    declared: dict[str, list[str]] = {}
    for name in registry.BACKENDS:
        keys = registry.backend(name).train_keys
        for f in dataclasses.fields(keys) if keys is not None else ():
            declared.setdefault(f.name, []).append(name)
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    backend_keys = [name for name in names if name.startswith(("wandb_", "mlflow_"))]
    assert backend_keys == ["wandb_project", "wandb_entity", "wandb_mode", "wandb_dir", "mlflow_tracking_uri",
                            "mlflow_experiment"]
    assert {key: declared.get(key) for key in backend_keys} == {key: [key.split("_")[0]] for key in backend_keys}
    assert set(declared) <= set(names)
    # still listed where config.py listed them: right after train.loggers
    assert names[names.index("loggers") + 1:names.index("progress")] == backend_keys
    source = textwrap.dedent(inspect.getsource(config))
    assert not re.findall(r"^\s+((?:wandb|mlflow)_\w+)\s*:", source, flags=re.M)
