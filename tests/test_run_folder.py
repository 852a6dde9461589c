"""The run folder's layout has one owner (``dflash_train.run_folder``) and keeps its names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from dflash_train import run_folder as rf

SRC = Path(__file__).resolve().parents[1] / "src" / "dflash_train"

# How the layout's names look when spelled out; `step-` only as a checkpoint folder name
# (followed by a digit, a format field or a glob), not in prose such as "step-by-step".
SPELLED = {
    "COMPLETE marker": re.compile(r"\bCOMPLETE\b"),
    "checkpoint folder name": re.compile(r"\bstep-(\d|\{|<|\*|$)"),
    "checkpoints folder": re.compile(r"^checkpoints/?$"),
    "file name": re.compile(r"\b(metrics\.jsonl|summary\.json|compile-artifacts\.bin|checksums\.json|"
                            r"drafter_config\.json|drafter\.safetensors)\b"),
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


def spelled_layout_names(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "run_folder.py":
            continue
        for line, text in _code_strings(ast.parse(path.read_text(), str(path))):
            for what, pattern in SPELLED.items():
                if pattern.search(text):
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
    assert (rf.CONFIG, rf.METRICS, rf.SUMMARY, rf.COMPILE_ARTIFACTS, rf.CHECKPOINTS) == (
        "config.json", "metrics.jsonl", "summary.json", "compile-artifacts.bin", "checkpoints")
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
