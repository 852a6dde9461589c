"""``metrics.jsonl``: one JSON object per record, the run's own record of what it logged.

The resume, ``summary.json`` (the first loss) and ``dflash-train curve`` read it, so it is
always on and ``required``: a write that fails (no space, an I/O error) is one line naming
the file, and the run stops there, its last checkpoint intact; a line half-written by it is
dropped at the resume (``rewind``).

Each line carries a short checksum of itself (``_sha256``, 12 hex digits: ``files.seal_json``),
verified wherever the file is read back (the resume's rewind, the summary's first loss,
``dflash-train curve``): a line whose bytes changed after it was appended but that still parses
is dropped, counted in a one-line note, instead of a wrong number feeding the run. Lines written
before lines carried one are read as they are (a note, once).
"""

from __future__ import annotations

from pathlib import Path

from dflash_train.faultpoints import reached
from dflash_train.files import UNSEALED, atomic_write_text, explained, note, note_once, seal_json, unseal_json
from dflash_train.run_folder import METRICS
from dflash_train.tracking.base import WRITE_TODO

LINE_DIGITS = 12  # the per-line checksum's hex digits: 48 bits, a few bytes a line


def check_line(line: str, path: Path, number: int, bad: list[int], old: list[int]):
    """The object of one ``metrics.jsonl`` line (checksum verified, field removed), or None
    when it is not JSON or its checksum does not match (its number then added to ``bad``)."""
    try:
        row, problem = unseal_json(line)
    except (ValueError, RecursionError):
        return None
    if problem == UNSEALED:
        old.append(number)
    elif problem is not None:
        bad.append(number)
        return None
    return row


def report_lines(path: Path, bad: list[int], old: list[int], echo=None) -> None:
    """The one-line notes of a read: lines dropped for a checksum mismatch (counted), lines
    without a checksum (once)."""
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        (echo or note)(f"dflash-train: {path}: {len(bad)} line(s) dropped: their checksum does not match (bytes "
                       f"changed after they were written): line {shown}")
    if old:
        note_once(f"dflash-train: note: {path}: {len(old)} line(s) carry no checksum (written by an older "
                  f"version); read as they are", echo)


def _read_rows(path: Path) -> list[tuple[str, dict]]:
    """``(line, row)`` for every line of ``path`` that is a JSON object whose checksum matches;
    torn, garbled or non-UTF-8 lines (a kill mid-append, a bad disk) are skipped, damaged ones
    that parse dropped with a note. Unreadable: one line."""
    with explained("cannot read metrics", path):
        data = path.read_bytes()
    rows, bad, old = [], [], []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        row = check_line(line, path, number, bad, old)
        if isinstance(row, dict):
            rows.append((line, row))
    report_lines(path, bad, old)
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
    train_keys = None  # no keys of its own (RUN/metrics.jsonl)
    resumable = ()

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
            f.write(seal_json({"step": step, **record}, digits=LINE_DIGITS) + "\n")
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
