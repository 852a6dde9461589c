"""A feature store dumped by two ranks (torchrun, gloo on the CPU): each rank writes its own shards and
index, the store holds every conversation once, and one process, or two colocated ranks each reading the
shards it wrote in the first epoch, train from it exactly as online; so do two ranks in the hybrid mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from dist_helpers import VENV_BIN, env, job, losses, save_tiny_target, tiny_target, torchrun_cmd  # noqa: E402

from dflash_train.config import config_from_dict  # noqa: E402
from dflash_train.features.reader import FeatureStore  # noqa: E402
from dflash_train.train.loop import train  # noqa: E402


def test_two_ranks_write_disjoint_shards_that_train_like_online(tmp_path):
    model = save_tiny_target(tmp_path / "model")
    online = job(tmp_path / "online", max_steps=8)
    online["target"]["path"] = str(model)
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(online))
    store = tmp_path / "store"
    cmd = torchrun_cmd(2, "--no-python", str(VENV_BIN / "dflash-train"), "features", str(config), "--out",
                       str(store), "--shard-mib", "0.05")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    indexes = [[json.loads(line) for line in (store / f"index-r00{r}.jsonl").read_text().splitlines()]
               for r in (0, 1)]
    samples = [{s[0] for line in lines for s in line["samples"]} for lines in indexes]
    assert samples[0] and samples[1] and not samples[0] & samples[1]
    assert all(line["shard"].startswith(f"r00{r}-") for r in (0, 1) for line in indexes[r])
    reader = FeatureStore(store)
    assert len(samples[0] | samples[1]) == reader.job["examples"] and reader.manifest["encoding"]["world"] == 2
    train(config_from_dict(online), target=tiny_target(), echo=lambda *a: None)
    stored = job(tmp_path / "stored", max_steps=8, feature_store=str(store))
    stored["target"]["path"] = str(model)
    train(config_from_dict(stored), target=tiny_target(), echo=lambda *a: None)
    assert losses(tmp_path / "stored" / "run") == losses(tmp_path / "online" / "run")
    hybrid = ["train.feature_cache=disk", f"train.feature_store={tmp_path / 'hstore'}", "train.max_steps=24"]
    for name, extra in (("online2", []), ("stored2", [f"train.feature_store={store}"]),  # two colocated ranks
                        ("online24", ["train.max_steps=24"]), ("hybrid24", hybrid)):
        run = subprocess.run(torchrun_cmd(2, "--no-python", str(VENV_BIN / "dflash-train"), "train", str(config),
                                          f"train.run_dir={tmp_path / name}", *extra),
                             capture_output=True, text=True, timeout=300, env=env())
        assert run.returncode == 0, run.stderr[-3000:]
    assert losses(tmp_path / "stored2") == losses(tmp_path / "online2") and len(losses(tmp_path / "online2")) == 8
    # the hybrid mode on two ranks: each writes its part of the first epoch, they meet at the switch, then read
    assert losses(tmp_path / "hybrid24") == losses(tmp_path / "online24") and len(losses(tmp_path / "online24")) == 24
    assert FeatureStore(tmp_path / "hstore").manifest["state"] == "complete"
    assert json.loads((tmp_path / "hybrid24" / "summary.json").read_text())["feature_store"]["micro_batches"] > 0
