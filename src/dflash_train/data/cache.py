"""On-disk cache of tokenized datasets, keyed by everything that changes the output.

The key hashes the data files' bytes, the tokenizer (its serialized vocab/merges and
special tokens), the chat template and the tokenization options, so a second run with
the same inputs memory-maps the Arrow file at once and any change re-tokenizes. Entries
are written to a temporary folder and renamed into place, so an interrupted run never
leaves a half-written cache that later runs would trust. Each entry carries the sha256 of its
files (``checksums.json``, written last), verified every time it is read: bytes damaged after
the write, even ones that still parse, make the entry corrupt, and it is tokenized again
with a one-line note instead of being trained on.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_train.faultpoints import reached
from dflash_train.files import (
    CHECKSUMS,
    explained,
    file_checksums,
    file_error,
    note,
    pid_alive,
    staged_folder,
    sweep_stale_temps,
    temp_path,
    verify_checksums,
)

from .errors import SkipReport

if TYPE_CHECKING:  # imported where used: paths that never read data (bench, eval) need no `datasets`
    import datasets

FORMAT_VERSION = 3  # 2: plain-text records; reports count truncation; 3: checksums.json, verified on read
DATA_FILE = "data.arrow"
REPORT_FILE = "report.json"


@cache
def features() -> datasets.Features:
    """The Arrow schema of a cache entry."""
    import datasets

    _List = getattr(datasets, "List", datasets.Sequence)
    return datasets.Features({
        "input_ids": _List(datasets.Value("int32")),
        "loss_mask": _List(datasets.Value("int8")),
        "length": datasets.Value("int32"),
        "num_supervised": datasets.Value("int32"),
    })


def default_cache_dir() -> Path:
    return Path(os.environ.get("DFLASH_DATA_CACHE", "~/.cache/dflash_train/data")).expanduser()


def _hash_path(h, path: Path) -> None:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with explained("cannot read data file", f), open(f, "rb") as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(chunk)


def tokenizer_fingerprint(tokenizer) -> str:
    """Vocab, merges, normalizer and special tokens (via tokenizer.json) plus the chat template."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update(backend.to_str().encode() if backend is not None else json.dumps(
        sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    h.update(str(tokenizer.chat_template).encode())
    return h.hexdigest()


def cache_key(files: Iterable[Path], tokenizer, options: dict) -> str:
    h = hashlib.sha256(f"dflash-data-v{FORMAT_VERSION}".encode())
    for f in files:
        _hash_path(h, Path(f))
    h.update(tokenizer_fingerprint(tokenizer).encode())
    h.update(json.dumps(options, sort_keys=True).encode())
    return h.hexdigest()[:32]


class CorruptEntry(Exception):
    """A cache entry whose files are there but do not read back (a crash, a bad disk)."""


_TODO = "set data.cache_dir (or DFLASH_DATA_CACHE) to a folder you can write"


def load_cached(entry: Path) -> tuple[datasets.Dataset, SkipReport] | None:
    """The entry's rows and report; None when it is not there; ``CorruptEntry`` when it is
    there but does not read back or its bytes do not match their checksums. A file fault
    (permission, I/O) is a one-line error."""
    if not (entry / DATA_FILE).exists() or not (entry / REPORT_FILE).exists():
        return None
    try:
        problem = verify_checksums(entry, raise_os_errors=True)
    except OSError as err:  # a fault of the place is one line naming the file; damaged bytes are corrupt
        with _entry_file(Path(err.filename) if err.filename else entry / DATA_FILE):
            raise
    if problem is not None:
        raise CorruptEntry(problem)
    with _entry_file(entry / REPORT_FILE):
        report = SkipReport.from_dict(json.loads((entry / REPORT_FILE).read_bytes().decode("utf-8")))
    import datasets

    with _entry_file(entry / DATA_FILE):
        return datasets.Dataset.from_file(str(entry / DATA_FILE)), report


# errors of the place (permissions, a failing disk): a one-line error, rebuilding would not help
_PLACE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EIO, errno.ENOSPC, errno.EROFS, errno.EMFILE, errno.ENFILE}


@contextlib.contextmanager
def _entry_file(path: Path):
    """Reading one file of an entry: a fault of the place is a one-line error; anything the
    bytes cause (truncated, garbled, a folder or a broken link where the file was) is a corrupt
    entry, rebuilt by the caller."""
    try:
        yield
    except OSError as err:
        if err.errno in _PLACE_ERRNOS:
            raise file_error(err, "cannot read data cache entry", path, _TODO) from None
        raise CorruptEntry(f"{path.name} does not read back ({err.strerror or type(err).__name__})") from None
    except Exception as err:  # noqa: BLE001 - json/pyarrow/SkipReport errors of a truncated or garbled file
        raise CorruptEntry(f"{path.name} does not read back ({type(err).__name__})") from None


def write_entry(entry: Path, rows: Iterable[dict], report: SkipReport, batch: int = 1000,
                replace: bool = False) -> None:
    """Stream rows into an Arrow file (never all in memory), then publish atomically. Any
    failure (no space, read-only, an error in ``rows``) leaves no temporary behind; ``replace``
    puts a new entry over a corrupt one."""
    with staged_folder(entry, "data cache entry", _TODO, publish=partial(_publish, replace=replace)) as tmp:
        _write_arrow(tmp, rows, batch)
        reached("cache-arrow")  # the rows written, the report and checksums not (the kill soak aims here)
        (tmp / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=1))
        (tmp / CHECKSUMS).write_text(json.dumps(file_checksums(tmp)))
        reached("cache-checksums")  # complete, not yet published


def _publish(tmp: Path, entry: Path, replace: bool = False) -> None:
    """Move a finished ``tmp`` into place, unless a complete entry is already there.

    Several runs started together (ablations on one data set) build the same entry at
    once. The first to finish publishes it; the others keep it and drop their copy, so
    a run that already loaded the entry never sees it removed. A partial entry (an old
    crash) or, with ``replace``, a corrupt one is moved aside (a temporary name: swept if
    this process dies here) and replaced."""
    try:
        os.replace(tmp, entry)  # atomic; fails on a non-empty folder
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not replace and (entry / DATA_FILE).exists() and (entry / REPORT_FILE).exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return
    aside = temp_path(entry)
    os.replace(entry, aside)
    os.replace(tmp, entry)
    shutil.rmtree(aside, ignore_errors=True)


def _legacy_temp(path: Path) -> bool:
    """``<key>.tmp-<pid>``, the name before ``files.temp_path``: stale when its pid is dead."""
    match = re.fullmatch(r"[0-9a-f]+\.tmp-(\d+)", path.name)
    return bool(match) and not pid_alive(int(match[1]))


def _write_arrow(tmp: Path, rows: Iterable[dict], batch: int) -> None:
    from datasets.arrow_writer import ArrowWriter

    with ArrowWriter(features=features(), path=str(tmp / DATA_FILE)) as writer:
        buf: list[dict] = []
        for row in rows:
            buf.append(row)
            if len(buf) >= batch:
                writer.write_batch({k: [r[k] for r in buf] for k in features()})
                buf = []
        if buf:
            writer.write_batch({k: [r[k] for r in buf] for k in features()})
        writer.finalize()


_rebuilt = [0]  # corrupt entries rebuilt by this process (``rebuilt_entries``)


def rebuilt_entries() -> int:
    """How many corrupt entries this process has rebuilt so far: a training run reports the ones
    rebuilt while it ran (``summary.json``'s ``cache_entries_rebuilt``, a line at its end), so a
    cache that keeps going bad is seen, not only noted once in a long log."""
    return _rebuilt[0]


def cached_build(cache_dir: Path, key: str, build: Callable[[SkipReport], Iterable[dict]],
                 echo: Callable[[str], None] = note) -> tuple[datasets.Dataset, SkipReport]:
    """Load entry ``key`` or create it from ``build(report)``'s rows. Temporaries of killed
    builds are swept first, and a corrupt entry is rebuilt (each with a one-line note)."""
    entry = Path(cache_dir) / key
    sweep_stale_temps(cache_dir, echo, _legacy_temp)
    try:
        hit = load_cached(entry)
    except CorruptEntry as err:
        echo(f"dflash-train: data cache entry {entry} is corrupt ({err}); tokenizing again")
        _rebuilt[0] += 1
        hit, replace = None, True
    else:
        replace = False
    if hit is not None:
        return hit
    report = SkipReport()
    write_entry(entry, build(report), report, replace=replace)
    return load_cached(entry)
