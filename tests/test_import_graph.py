"""The import graph between subpackages has no cycle and no upward arrow (issue 59; ``make lint`` runs the
same check), and the checker sees both, including imports hidden inside functions."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "import_graph.py"


def _graph():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_repository_has_no_cycle_and_no_upward_arrow():
    lines: list[str] = []
    problems = _graph().check(ROOT, out=lambda *parts: lines.append(" ".join(map(str, parts))))
    assert problems == 0, "\n".join(lines)
    assert "cycles: none" in lines and "upward arrows: none" in " ".join(lines)


def test_the_command_fails_on_the_repository_only_when_the_graph_is_wrong():
    done = subprocess.run([sys.executable, str(SCRIPT), str(ROOT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 cycles, 0 upward arrows, 0 unplaced" in done.stdout


def _fake(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "src" / "dflash_train" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_cycle_hidden_in_a_function_and_an_upward_arrow_are_caught(tmp_path):
    graph = _graph()
    repo = _fake(tmp_path, {
        "__init__.py": "",
        "low.py": "def helper():\n    from dflash_train.high import thing  # upward, inside a function\n    return thing\n",
        "high/__init__.py": "from dflash_train import low\n",
        "high/thing.py": "from .. import low\n",
        "left.py": "import dflash_train.right\n",
        "right.py": "def f():\n    from dflash_train.left import x\n",
        "by_name.py": 'COMMANDS = ["dflash_train.top.cli"]\n',
        "top/__init__.py": "",
    })
    layers = (("dflash_train", "low"), ("high", "left", "right"), ("by_name",), ("top",))
    lines: list[str] = []
    problems = graph.check(repo, layers, out=lambda *parts: lines.append(" ".join(map(str, parts))))
    text = "\n".join(lines)
    assert "high -> low -> high" in text  # the cycle through the function-level import
    assert "left -> right -> left" in text
    arrows = {(s, t) for s, t, _ in graph.upward(graph.scan(repo / "src" / "dflash_train")[0],
                                                 {n: r for r, names in enumerate(layers) for n in names})}
    # low -> high goes up; left <-> right are peers of one layer (sideways counts); by_name names top as a string
    assert arrows == {("low", "high"), ("left", "right"), ("right", "left"), ("by_name", "top")}
    assert "low (layer 0) -> high (layer 1): dflash_train/low.py:2" in text  # where: the function's import
    assert problems == 2 + 4 and "FAIL" in lines[-1]
    done = subprocess.run([sys.executable, str(SCRIPT), str(repo)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1  # the default layers do not place these names either


def test_a_package_in_no_layer_is_refused(tmp_path):
    graph = _graph()
    repo = _fake(tmp_path, {"__init__.py": "", "a.py": "", "newcomer/__init__.py": "from dflash_train import a\n"})
    lines: list[str] = []
    assert graph.check(repo, (("dflash_train", "a"),), out=lambda *parts: lines.append(" ".join(map(str, parts)))) == 1
    assert any("in no layer" in line and "newcomer" in line for line in lines)
