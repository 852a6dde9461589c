"""No tracked file names a folder of the machines things ran on (issue 49, point 5).

Device logs, JSON results and scripts come back from the GPU machine naming its kept and output folders,
pytest's temp folders and the checkout's absolute path. Those mean nothing on a reader's machine, so
``scripts/scrub_machine_paths.py`` replaces them with placeholders (``docs/results/README.md`` says what
each stands for) and this test fails on any that remain, naming ``file:line``. Only tracked files are read
(``git ls-files``): runs/, assets/ and .venv never are.

The paths in this file are written as ``S + "root/..."`` so that it holds none itself.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
S = "/"
MACHINE_PATH = re.compile(r"(^|[^.A-Za-z0-9_])/(root|work|tmp|home)/")
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".xz", ".gz", ".tgz", ".bz2", ".zst", ".zip",
                   ".tar", ".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npy", ".npz", ".pkl", ".whl"}
# (repository-relative file -> why it may name machine paths). Kept tiny: a fixture that needs a real
# absolute path builds it at run time (tmp_path) instead of being listed here.
ALLOWED: dict[str, str] = {}

POSITIVE = [f"{S}root/keep/x", f"cd {S}tmp/o", f"rootdir: {S}work/main/", f"'{S}home/u/x'",
            f"({S}work/main/src/a.py:3)", f'"checkpoint": "{S}root/r8/run"', f"K=${{K:-{S}root/keep}}/"]
NEGATIVE = ["a/tmp/b", "src/dflash_train/tmp/x", "./tmp/x", "http://host/tmp/x", "runs/root/x",
            f"{S}tmp", f"{S}rooted/x", f"{S}workspace/x", "$KEEP/smollm2", "<tmp>/o", "~/r8"]


def tracked_files() -> list[str]:
    """The files git tracks here, or a skip when this is not a git checkout (an sdist, a copied tree)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    result = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: no tracked files to check")
    return [name for name in result.stdout.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """A tracked file's text, or None for binary/compressed files (their bytes are not lines)."""
    if path.suffix.lower() in BINARY_SUFFIXES or not path.is_file():
        return None
    data = path.read_bytes()
    return None if b"\0" in data else data.decode("utf-8", errors="replace")


def machine_path_lines(name: str, text: str) -> list[str]:
    """`file:line: text` for each line naming a machine path."""
    return [f"{name}:{i}: {line.strip()[:160]}" for i, line in enumerate(text.splitlines(), 1)
            if MACHINE_PATH.search(line)]


@pytest.mark.parametrize("text", POSITIVE)
def test_the_matcher_finds_machine_paths(text):
    assert MACHINE_PATH.search(text), text


@pytest.mark.parametrize("text", NEGATIVE)
def test_the_matcher_leaves_relative_paths_urls_and_placeholders(text):
    assert not MACHINE_PATH.search(text), text


def test_the_scrubber_removes_what_the_matcher_finds():
    """The tool and the test agree: every positive example comes out clean, with the placeholder it means."""
    spec = importlib.util.spec_from_file_location("scrub", REPO / "scripts" / "scrub_machine_paths.py")
    scrub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scrub)
    for text in POSITIVE + NEGATIVE:
        assert not MACHINE_PATH.search(scrub.scrub_text(text)), text
    assert [scrub.scrub_text(t) for t in NEGATIVE] == NEGATIVE
    assert scrub.scrub_text(f"{S}root/keep/smollm2 {S}root/out/x {S}root/r8/y") == "$KEEP/smollm2 $OUT/x ~/r8/y"
    assert scrub.scrub_text(f"rootdir: {S}work/main") == "rootdir: ."
    assert scrub.scrub_text(f'File "{S}work/wt49/src/a.py"') == 'File "src/a.py"'
    assert scrub.scrub_text(f"{S}tmp/pytest-of-root/pytest-0/t0/run {S}tmp/rsm") == "<tmp>/t0/run <tmp>/rsm"
    assert scrub.scrub_text(f"{S}home/alice/x") == "~/x"


def test_the_scrubber_takes_a_results_folder_and_names_a_missing_path(tmp_path, capsys):
    """A folder that came back from the machine is scrubbed file by file (its subfolders too); a path that
    is not there is one line, not a traceback."""
    spec = importlib.util.spec_from_file_location("scrub", REPO / "scripts" / "scrub_machine_paths.py")
    scrub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scrub)
    (tmp_path / "res" / "fs").mkdir(parents=True)
    (tmp_path / "res" / "a.log").write_text(f"saved in {S}root/keep/sb\n")
    (tmp_path / "res" / "fs" / "b.json").write_text(f'{{"store": "{S}root/keep/sb/store"}}')
    assert scrub.main([str(tmp_path / "res")]) == 0
    assert (tmp_path / "res" / "a.log").read_text() == "saved in $KEEP/sb\n"
    assert (tmp_path / "res" / "fs" / "b.json").read_text() == '{"store": "$KEEP/sb/store"}'
    assert capsys.readouterr().out.endswith("changed 2 line(s) in 2 file(s)\n")
    with pytest.raises(SystemExit, match="no such file or folder"):
        scrub.main([str(tmp_path / "gone")])


def test_no_tracked_file_names_a_machine_path():
    found = []
    for name in tracked_files():
        if name in ALLOWED or (text := text_of(REPO / name)) is None:
            continue
        found += machine_path_lines(name, text)
    assert not found, (f"{len(found)} line(s) name a machine's folder; run "
                       "`python scripts/scrub_machine_paths.py` (placeholders: docs/results/README.md):\n"
                       + "\n".join(found[:50]))


def test_every_allowed_file_is_tracked_and_has_a_reason():
    tracked = set(tracked_files())
    for name, reason in ALLOWED.items():
        assert name in tracked and reason.strip(), name
