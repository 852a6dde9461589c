"""What the engines we drive (llama.cpp, vLLM) share when they are set up once per machine.

Each engine lives outside the repository in a cache folder keyed by its version, so every clone
and worktree of a machine shares one copy. A setup holds an exclusive ``flock`` (a second one
waits, then finds the work done), logs every command it runs into one file, and writes its
marker file last (a setup without the marker is redone).

The marker also records the sha256 and size of the setup's key files (``files``): the programs a
build made, the files that say which vLLM and torch an environment holds. They are verified when
the setup is used and when it is asked for again: a file changed after the setup (a bad disk, a
stray edit, a half-copied cache) is named in one line and the setup redone (llama.cpp relinks the
damaged programs) instead of being run. A marker written before markers carried them is used as
it is, with a note once.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

from dflash_train.files import sha256_file

FILES = "files"  # in a marker: {path relative to the cache folder: {"sha256", "bytes"}} of its key files


@contextmanager
def locked(path: Path, who: str):
    """An exclusive flock on ``path``: a second setup waits (and then finds the setup done)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{who}: another process is setting up {path.parent}; waiting for it", file=sys.stderr)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_logged(cmd: list[str], log: Path, what: str, error: type[Exception], who: str,
               cwd: Path | None = None) -> None:
    """Run ``cmd`` with its output appended to ``log``; a failure raises ``error`` in one message:
    what failed, its exit status and the log's last lines (no traceback)."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise error(f"{who}: {what} failed (exit {done.returncode}); log {log}:\n" + "\n".join(tail))


def done_before(stamp: Path, force: bool) -> dict | None:
    """The marker's record when an earlier setup completed (and ``force`` is off); else None, with the
    marker removed, so a setup stopped half-way is never taken for a finished one."""
    if stamp.is_file() and not force:
        try:
            record = json.loads(stamp.read_text())
        except (OSError, ValueError, RecursionError):  # a damaged marker: the setup is redone
            record = None
        if isinstance(record, dict):
            return record
    stamp.unlink(missing_ok=True)
    return None


def file_record(root: Path, paths: Iterable[Path]) -> dict[str, dict]:
    """``{path relative to root: {"sha256", "bytes"}}`` of ``paths`` (the marker's ``files``)."""
    return {str(p.relative_to(root)): {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in sorted(paths)}


def damaged_files(root: Path, record: dict) -> list[str] | None:
    """The files the marker ``record`` names whose bytes changed since the setup (missing, another
    size, another sha256); None when the marker names none (written before markers did)."""
    files = record.get(FILES)
    if not isinstance(files, dict) or not files:
        return None
    bad = []
    for name, want in sorted(files.items()):
        try:
            path = root / name
            if path.stat().st_size != want["bytes"] or sha256_file(path) != want["sha256"]:
                bad.append(name)
        except (OSError, TypeError, KeyError):
            bad.append(name)
    return bad
