"""``dflash-train plan``: the topology arithmetic, and a real measurement on a tiny job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_helpers import env, job, save_tiny_target  # noqa: E402

from dflash_train.distributed.disagg import Topology  # noqa: E402
from dflash_train.distributed.plan import recommend  # noqa: E402


def test_recommend_picks_the_best_split():
    # target 3x faster than drafter: colocated 8 / (1/300 + 1/100) = 600; 2+6 -> min(600, 600) = 600
    result = recommend(300.0, 100.0, 8)
    by_name = {o["topology"]: o["tokens_per_s"] for o in result["options"]}
    assert by_name["colocated"] == pytest.approx(600.0)
    assert by_name["2+6"] == pytest.approx(600.0) and by_name["5+3"] == pytest.approx(300.0)
    assert result["recommended"]["topology"] == "colocated"  # a tie goes to the simpler topology
    # 3 GPUs, target 2x faster: colocated 3 / (1/200 + 1/100) = 200 = 1+2 split; 2+1 is worse
    small = recommend(200.0, 100.0, 3)
    assert [o["topology"] for o in small["options"]] == ["colocated", "1+2", "2+1"]
    assert small["options"][2]["tokens_per_s"] == pytest.approx(100.0)
    assert small["recommended"]["tokens_per_s"] == pytest.approx(200.0)


def test_topology_validation():
    assert not Topology.build(4).disaggregated
    topo = Topology.build(8, 5, 3)
    assert topo.drafters() == [0, 1, 2] and topo.targets() == [3, 4, 5, 6, 7]
    assert [topo.target_for(0, k) for k in range(6)] == [3, 4, 5, 6, 7, 3]
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        Topology.build(8, 5, 4)
    with pytest.raises(ValueError, match=">= 1"):
        Topology.build(8, 8, 0)


def test_plan_cli_measures_and_recommends(tmp_path):
    cfg = job(tmp_path)
    cfg["target"]["path"] = str(save_tiny_target(tmp_path / "target"))
    (tmp_path / "job.json").write_text(json.dumps(cfg))
    cli = Path(sys.executable).parent / "dflash-train"
    proc = subprocess.run([str(cli), "plan", str(tmp_path / "job.json"), "--gpus", "4", "--steps", "2"],
                          capture_output=True, text=True, timeout=180, env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["target_tokens_per_s"] > 0 and result["drafter_tokens_per_s"] > 0
    assert result["recommended"]["tokens_per_s"] == max(o["tokens_per_s"] for o in result["options"])
    assert "recommended" in proc.stdout and "torchrun --nproc-per-node 4" in result["command"]
