"""The run folder's layout has one owner (``dflash_train.run_folder``) and keeps its names."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_train import run_folder as rf

SRC = Path(__file__).resolve().parents[1] / "src" / "dflash_train"

# How the layout's names look when spelled out; `step-` only as a checkpoint folder name
# (followed by a digit, a format field or a glob), not in prose such as "step-by-step".
SPELLED = {
    "COMPLETE marker": re.compile(r"\bCOMPLETE\b"),
    "checkpoint folder name": re.compile(r"\bstep-(\d|\{|<|\*|$)"),
    "checkpoints folder": re.compile(r"^checkpoints/?$"),
    "file name": re.compile(r"\b(metrics\.jsonl|summary\.json|compile-artifacts\.bin|"
                            r"drafter_config\.json|drafter\.safetensors|tracking\.json)\b"),
    "checksum file": re.compile(r"\bchecksums\.json\b"),
}


def _code_strings(tree: ast.AST):
    """(line, text) of every string literal that is not a docstring (f-string parts included)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


# files.py owns the checksum file's name: every folder read back (checkpoints, data-cache entries) carries one
OWNERS = {"run_folder.py": set(SPELLED), "files.py": {"checksum file"}}


def spelled_layout_names(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        owned = OWNERS.get(str(path.relative_to(root)), set())
        for line, text in _code_strings(ast.parse(path.read_text(), str(path))):
            for what, pattern in SPELLED.items():
                if what not in owned and pattern.search(text):
                    found.append(f"{path.relative_to(root)}:{line}: {what} spelled out ({text!r})")
    return found


def test_only_run_folder_spells_the_layout():
    """Every module asks ``run_folder`` for the layout's names instead of writing them."""
    found = spelled_layout_names(SRC)
    assert not found, "ask dflash_train.run_folder instead:\n" + "\n".join(found)


def test_the_check_sees_a_spelled_name(tmp_path):
    """The scan above is not vacuous: literals are found, docstrings and prose are not."""
    (tmp_path / "run_folder.py").write_text('X = "COMPLETE"\n')
    (tmp_path / "a.py").write_text('"""Docstring: COMPLETE, step-1, metrics.jsonl."""\n'
                                   'x = "give step-by-step instructions"\n'
                                   'def f(run, n):\n    return run / "checkpoints" / f"step-{n:08d}" / "COMPLETE"\n')
    found = spelled_layout_names(tmp_path)
    assert sorted(f.split(": ")[1].split(" spelled")[0] for f in found) == [
        "COMPLETE marker", "checkpoint folder name", "checkpoints folder"]
    assert all(f.startswith("a.py:4: ") for f in found)


def test_names_of_existing_run_folders_are_kept():
    """Run folders written before this module existed stay readable: the names do not change."""
    assert (rf.CONFIG, rf.METRICS, rf.SUMMARY, rf.COMPILE_ARTIFACTS, rf.CHECKPOINTS, rf.TRACKING) == (
        "config.json", "metrics.jsonl", "summary.json", "compile-artifacts.bin", "checkpoints", "tracking.json")
    assert (rf.DRAFTER_CONFIG, rf.DRAFTER_WEIGHTS, rf.CHECKSUMS, rf.COMPLETE) == (
        "drafter_config.json", "drafter.safetensors", "checksums.json", "COMPLETE")
    assert rf.checkpoint_dir(Path("run"), 120) == Path("run/checkpoints/step-00000120")


def test_listing_orders_by_step_and_skips_incomplete(tmp_path):
    run = tmp_path / "run"
    assert rf.complete_checkpoints(run) == [] and rf.latest_checkpoint(run) is None
    names = ["step-9", "step-00000010", "step-100", "step-00000120.tmp", "step-x", "other"]
    for name in names:
        (run / "checkpoints" / name).mkdir(parents=True)
        (run / "checkpoints" / name / "COMPLETE").write_text("")
    (run / "checkpoints" / "step-200").mkdir()  # no marker: being written, or a crash
    (run / "checkpoints" / "step-300").write_text("")  # a file, not a folder
    assert [p.name for p in rf.checkpoint_folders(run)] == ["step-9", "step-00000010", "step-100", "step-200"]
    assert [p.name for p in rf.complete_checkpoints(run)] == ["step-9", "step-00000010", "step-100"]
    assert rf.latest_checkpoint(run).name == "step-100"
    assert [rf.checkpoint_step(Path(n)) for n in names] == [9, 10, 100, -1, -1, -1]


# -- one run per folder (run_lock.py) ---------------------------------------------------------
def _lines():
    out = []
    return out, out.append


def test_a_second_run_is_refused_naming_the_holder(tmp_path):
    from dflash_train.files import HOST
    from dflash_train.run_lock import RunFolderBusy, hold_run_folder

    run = tmp_path / "run"
    with hold_run_folder(run, command="dflash-train train first"):
        with pytest.raises(RunFolderBusy) as caught, hold_run_folder(run, command="second"):
            pass
        text = str(caught.value)
        assert "\n" not in text and f"pid {os.getpid()} on host {HOST}" in text and "dflash-train train first" in text
        assert str(run) in text
    assert not (run / rf.LOCK).exists()  # released: the next run may start
    notes, echo = _lines()
    with hold_run_folder(run, echo=echo):
        pass
    assert notes == []


HOLDER = """
import sys, time
from dflash_train.run_lock import hold_run_folder
with hold_run_folder(sys.argv[1], command="holder"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_live_holder_refuses_and_a_killed_one_is_taken_over(tmp_path):
    from dflash_train.run_lock import RunFolderBusy, hold_run_folder

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusy, match=f"pid {proc.pid} .*holder"), hold_run_folder(run):
            pass
    finally:
        proc.kill()  # SIGKILL: no cleanup runs; the kernel drops the flock
        proc.wait()
    (run / "metrics.jsonl.tmp").write_text("x")
    (run / "notes.tmp").write_text("the user's own file")  # not a name a run writes: kept
    (run / "checkpoints" / "step-00000003.tmp").mkdir(parents=True)
    (run / "checkpoints" / "step-00000002").mkdir()
    notes, echo = _lines()
    with hold_run_folder(run, echo=echo):
        assert json.loads((run / rf.LOCK).read_text())["pid"] == os.getpid()
    assert len(notes) == 3 and f"pid {proc.pid}" in notes[0] and "took over" in notes[0]
    assert "metrics.jsonl.tmp" in notes[1] and "step-00000003.tmp" in notes[2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002"]
    assert not (run / "metrics.jsonl.tmp").exists() and (run / "notes.tmp").exists()


def test_without_flock_the_recorded_holder_decides(tmp_path, monkeypatch):
    """File systems without flock: a holder on this host with a dead pid is stale; another
    host's cannot be checked, so it is refused with the lock's path to remove by hand."""
    import errno

    from dflash_train import run_lock
    from dflash_train.files import HOST

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_flock)
    run = tmp_path / "run"
    run.mkdir()
    (run / rf.LOCK).write_text(json.dumps({"host": "other-node", "pid": 1, "started": 0, "command": "x"}))
    with pytest.raises(run_lock.RunFolderBusy, match=f"other-node.*remove {run / rf.LOCK}"), \
            run_lock.hold_run_folder(run):
        pass
    assert (run / rf.LOCK).exists()  # another's lock is never removed by a refused run
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run / rf.LOCK).write_text(json.dumps({"host": HOST, "pid": int(dead.stdout), "started": 0, "command": "x"}))
    notes, echo = _lines()
    with run_lock.hold_run_folder(run, echo=echo):
        pass
    assert "took over" in notes[0]


def test_only_the_main_rank_holds_the_lock(tmp_path):
    from dflash_train.run_lock import hold_run_folder

    with hold_run_folder(tmp_path / "run", enabled=False) as lock:
        assert lock is None and not (tmp_path / "run").exists()


def test_train_refuses_a_folder_another_run_holds(tmp_path):
    """The wiring in train/loop.py: refused before any data, model or folder work."""
    from dflash_train.config import load_config
    from dflash_train.run_lock import RunFolderBusy, hold_run_folder
    from dflash_train.train.loop import train

    cfg = load_config("cpu-demo", [f"train.run_dir={tmp_path / 'run'}", f"data.paths=[{tmp_path / 'nope.jsonl'}]"])
    with hold_run_folder(tmp_path / "run"), pytest.raises(RunFolderBusy):
        train(cfg)
    with pytest.raises((ValueError, FileNotFoundError), match="nope.jsonl"):  # free: it gets to the data check
        train(cfg)
    assert not (tmp_path / "run" / rf.LOCK).exists()


@pytest.mark.parametrize("checksums", [
    "[1, 2]", '{"a": 1}', '{"../../etc/passwd": {"sha256": "0", "bytes": 1}}', '{"a": {"sha256": "0"}}',
    "[" * 100_000, "\udcff",
])
def test_a_malformed_checksum_file_is_a_problem_not_a_traceback(tmp_path, checksums):
    folder = tmp_path / "step-1"
    folder.mkdir()
    (folder / "a").write_text("x")
    (folder / rf.CHECKSUMS).write_bytes(checksums.encode("utf-8", "surrogateescape"))
    problem = rf.verify_checkpoint(folder)
    assert problem is not None and rf.CHECKSUMS in problem and "\n" not in problem


def _checkpoint(path: Path, complete: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "drafter.safetensors").write_text(path.name)
    if complete:
        (path / rf.COMPLETE).write_text("done")
    return path


def test_a_checkpoint_set_aside_by_a_killed_same_step_save_is_put_back_or_removed(tmp_path):
    """A kill between ``_commit``'s two renames (found by the kill soak) left ``step-N.old`` as the
    only complete step N, never read, never removed: the lock puts it back; beside a complete
    ``step-N`` (killed after the second rename) it is removed; an incomplete one is left."""
    from dflash_train.run_lock import hold_run_folder

    run = tmp_path / "run"
    alone = _checkpoint(rf.checkpoint_dir(run, 4).with_name("step-00000004.old"))
    beside = _checkpoint(rf.checkpoint_dir(run, 2).with_name("step-00000002.old"))
    _checkpoint(rf.checkpoint_dir(run, 2))
    broken = _checkpoint(rf.checkpoint_dir(run, 1).with_name("step-00000001.old"), complete=False)
    notes = []
    with hold_run_folder(run, echo=notes.append):
        pass
    assert not alone.exists() and (rf.checkpoint_dir(run, 4) / "drafter.safetensors").read_text() == alone.name
    assert not beside.exists() and rf.is_complete(rf.checkpoint_dir(run, 2))
    assert broken.exists() and not rf.checkpoint_dir(run, 1).exists()
    assert rf.latest_checkpoint(run) == rf.checkpoint_dir(run, 4)
    assert len([n for n in notes if "put" in n or "removed" in n]) == 2
