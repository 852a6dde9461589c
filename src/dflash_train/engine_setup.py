"""What the engines we drive (llama.cpp, vLLM) share when they are set up once per machine.

Each engine lives outside the repository in a cache folder keyed by its version, so every clone
and worktree of a machine shares one copy. A setup holds an exclusive ``flock`` (a second one
waits, then finds the work done), logs every command it runs into one file, and writes its
marker file last (a setup without the marker is redone).
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path


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
        return json.loads(stamp.read_text())
    stamp.unlink(missing_ok=True)
    return None
