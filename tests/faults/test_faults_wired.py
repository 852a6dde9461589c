"""The read/write points wired in the second round of issue 39 (docs/faults.md): checkpoint save
and load, export, the run folder's metrics/summary/config, compile artifacts, eval reports,
regeneration output, the data readers and prompt files, each under every fault that applies
(``fault_harness.py``). On 7f9d2a4 these fail: ENOSPC tracebacks out of DCP and a ``step-N.tmp``
left behind, raw ``OSError``s, ``metrics.jsonl.tmp`` debris, a data folder's link loop
recursing until the path is too long."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fault_harness import Point, cases, drive
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.export.cli import read_training_artifact
from dflash_train.export.serving import export_drafter
from dflash_train.models.target import Target
from dflash_train.run_folder import CHECKSUMS, CONFIG, DRAFTER_CONFIG, DRAFTER_WEIGHTS, file_checksums
from dflash_train.train.checkpoint import PARTS, CheckpointManager


# -- checkpoints ----------------------------------------------------------------------------------
class _Position:
    def __init__(self):
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def _manager(run_dir: Path) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    clock = {"step": 2}
    manager = CheckpointManager(run_dir, model=model, optimizer=optimizer, drafter=model,
                                parts={"position": _Position()}, config={"train": {"seed": 0}},
                                drafter_config={"block_size": 4}, step=lambda: clock["step"], keep_last=3,
                                echo=lambda *a: None)
    return {"manager": manager, "clock": clock, "run": run_dir}


def _save_setup(tmp):
    ctx = _manager(tmp / "run")
    ctx["earlier"] = ctx["manager"].save()  # step 2: must survive a failed save of step 4
    ctx["clock"]["step"] = 4
    return ctx


def _earlier_files(ctx) -> list[Path]:
    return sorted(p for p in ctx["earlier"].rglob("*") if p.is_file())


CHECKPOINT_SAVE = Point(
    name="checkpoint-save", setup=_save_setup, writes=True, act=lambda ctx: ctx["manager"].save(),
    target=lambda ctx: ctx["run"] / "checkpoints" / "step-00000004", keep=_earlier_files,
    check=lambda ctx, final: (final / "COMPLETE").is_file() or pytest.fail("no COMPLETE"),
)


def _load_point(file: str, wrong_types: list[bytes], wrong_names: list[str]) -> Point:
    return Point(
        name=f"checkpoint-load-{file}", setup=_save_setup, act=lambda ctx: ctx["manager"].load(ctx["earlier"]),
        target=lambda ctx: ctx["earlier"] / file, names=lambda ctx: ctx["earlier"].name, content=lambda ctx: (ctx["earlier"] / file).read_bytes(),
        wrong_types=wrong_types, wrong_type_names=wrong_names,
    )


CHECKPOINT_LOAD = [
    _load_point(CONFIG, [b"[1, 2]", b'"text"'], [CONFIG, CONFIG]),
    _load_point(PARTS, [b"[1, 2]", b'{"position": 3}'], [PARTS, PARTS]),
]


# -- export ---------------------------------------------------------------------------------------
_DRAFTER = {}


def _tiny():
    if not _DRAFTER:
        drafter, cfg = tiny_drafter(Target(tiny_qwen3()), num_layers=1)
        _DRAFTER.update(drafter=drafter.eval(), cfg=cfg)
    return _DRAFTER["drafter"], _DRAFTER["cfg"]


def _export_setup(tmp):
    drafter, cfg = _tiny()
    out = export_drafter(drafter, cfg, tmp / "export", dtype=torch.float32)  # replaced with force: kept on failure
    return {"out": out, "drafter": drafter, "cfg": cfg}


EXPORT_WRITE = Point(
    name="export-write", setup=_export_setup, writes=True,
    act=lambda ctx: export_drafter(ctx["drafter"], ctx["cfg"], ctx["out"], force=True, dtype=torch.float32),
    target=lambda ctx: ctx["out"], keep=lambda ctx: sorted(p for p in ctx["out"].iterdir() if p.is_file()),
    check=lambda ctx, out: (out / "config.json").is_file() or pytest.fail("no config.json"),
)


def _artifact_setup(tmp):
    ctx = _manager(tmp / "run")
    _tiny_drafter, cfg = _tiny()
    ckpt = ctx["manager"].save()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in _tiny_drafter.state_dict().items()}, str(ckpt / DRAFTER_WEIGHTS))
    (ckpt / DRAFTER_CONFIG).write_text(json.dumps(cfg.to_dict()))
    (ckpt / CHECKSUMS).write_text(json.dumps(file_checksums(ckpt)))
    return ckpt


def _artifact_point(file: str, faults: list[str] | None = None, wrong_types=()) -> Point:
    """The export's reads of a checkpoint: behind its checksums, so every fault is one line
    naming the checkpoint (and what to export instead)."""
    ckpt_name = "step-00000002"
    return Point(
        name=f"export-read-{file}", setup=_artifact_setup, act=read_training_artifact,
        target=lambda ckpt: ckpt / file, content=lambda ckpt: (ckpt / file).read_bytes(), faults=faults,
        names=lambda ckpt: ckpt.name, wrong_type_names=[ckpt_name] * len(wrong_types),
        wrong_types=list(wrong_types),
    )


EXPORT_READ = [
    _artifact_point(DRAFTER_CONFIG, wrong_types=[b"[1]", b'{"block_size": "big"}']),
    _artifact_point(DRAFTER_WEIGHTS, faults=["read:EACCES", "read:EIO", "dangling-link", "link-loop", "a-folder",
                                             "truncated", "garbage"]),
]


def test_a_killed_exports_temporary_is_swept(tmp_path, capsys):
    """A temporary of a dead owner (staged-folder name) and an old legacy one are swept, with a
    note; a fresh legacy one (an export that may still run) is left."""
    import os

    drafter, cfg = _tiny()
    dead = tmp_path / f".export.tmp-999999999@{__import__('socket').gethostname()}-abcdef"
    legacy_old, legacy_new = tmp_path / ".export.tmp-0123abcd", tmp_path / ".export.tmp-4567cdef"
    for folder in (dead, legacy_old, legacy_new):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    os.utime(legacy_old, (1, 1))
    export_drafter(drafter, cfg, tmp_path / "export", dtype=torch.float32)
    assert not dead.exists() and not legacy_old.exists() and legacy_new.exists()
    assert "removed 2 stale temporary" in capsys.readouterr().err


POINTS = [CHECKPOINT_SAVE, *CHECKPOINT_LOAD, EXPORT_WRITE, *EXPORT_READ]


@pytest.mark.parametrize(("point", "fault"), cases(POINTS))
def test_point_under_fault(point, fault, tmp_path, monkeypatch):
    drive(point, fault, tmp_path, monkeypatch)


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.name)
def test_point_without_fault(point, tmp_path):
    ctx = point.setup(tmp_path)
    result = point.act(ctx)
    if point.check:
        point.check(ctx, result)
