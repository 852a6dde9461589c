"""``metrics.jsonl``: one JSON object per record, the run's own record of what it logged.

The resume, ``summary.json`` (the first loss) and ``dflash-train curve`` read it, so it is
always on and ``required``: a write that fails (no space, an I/O error) is one line naming
the file, and the run stops there, its last checkpoint intact; a line half-written by it is
dropped at the resume (``rewind``).
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_train.faultpoints import reached
from dflash_train.files import atomic_write_text, explained
from dflash_train.run_folder import METRICS
from dflash_train.tracking.base import WRITE_TODO


def _read_rows(path: Path) -> list[tuple[str, dict]]:
    """``(line, row)`` for every line of ``path`` that is a JSON object; torn, garbled or
    non-UTF-8 lines (a kill mid-append, a bad disk) are skipped. Unreadable: one line."""
    with explained("cannot read metrics", path):
        data = path.read_bytes()
    rows = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append((line, row))
    return rows


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl`` that carry an integer step ([] without the file)."""
    path = Path(run_dir) / METRICS
    if not (path.exists() or path.is_symlink()):
        return []
    return [row for _, row in _read_rows(path) if isinstance(row.get("step"), int)]


class JsonlSink:
    """Appends ``{"step": N, **record}`` to ``RUN/metrics.jsonl``."""

    name = "jsonl"
    required = True
    resumable = ()  # no keys of its own (RUN/metrics.jsonl)

    @staticmethod
    def check_config(train) -> None:
        """No keys of its own."""

    @classmethod
    def check(cls, settings) -> None:
        """Nothing of its own: the preflight found the run folder writable."""

    def __init__(self, settings):
        self.path = Path(settings.run_dir) / METRICS

    def log(self, step: int, record: dict) -> None:
        with explained("cannot write metrics", self.path, WRITE_TODO), self.path.open("a") as f:
            f.write(json.dumps({"step": step, **record}) + "\n")
            reached("metrics-append")  # the line in the file's buffer, not yet closed (the kill soak aims here)

    def rewind(self, step: int) -> None:
        """Keep only the rows up to ``step`` (-1: none, a fresh run), rewritten atomically: the
        steps redone after the checkpoint are logged again, not twice. A line that is not JSON
        (torn by a kill) is dropped."""
        if not (self.path.exists() or self.path.is_symlink()):
            return
        lines = [line for line, row in _read_rows(self.path)
                 if isinstance(row.get("step"), int) and row["step"] <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in lines), "metrics", WRITE_TODO)

    def close(self) -> None:
        """Every record is on disk when ``log`` returns: nothing to do."""
