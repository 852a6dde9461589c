"""Read chat data from JSONL / JSON / Parquet files, folders of them, or ``save_to_disk`` folders.

Every format is normalised to ``Record(id, location, messages)`` where ``messages`` is a
list of ``{"role", "content"}`` dicts (assistant messages may carry ``reasoning_content``),
or, for plain-text records (a ``text`` field), ``Record(id, location, [], text)``; the
record schemas themselves are parsed in :mod:`.records`. One file holds one kind: the
first record decides, and a record of the other kind is a counted ``mixed_kinds`` skip.
JSONL is read line by line in binary so that malformed JSON and non-UTF-8 bytes are
reported with ``file:line``; JSON arrays, Parquet rows and Arrow rows are reported as
``file:N`` with N the 1-based record number.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dflash_train.files import UserFacingError, explained

from .errors import DataError, SkipReport, handle
from .records import normalize, plain_text, record_kind

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class Record:
    id: str
    location: str
    messages: list[dict]
    text: str | None = None  # a plain-text record: no messages, loss on every token


def resolve_files(paths: list[str]) -> list[Path]:
    """Expand files and folders into a sorted, de-duplicated list of data files / Arrow folders."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            if p.is_symlink():  # a dangling link or a loop: named as such
                with explained("data path", p):
                    os.stat(p)
            raise FileNotFoundError(f"data path not found: {raw}")
        if p.is_dir() and _is_saved_dataset(p):
            out.append(p)
        elif p.is_dir():
            found = _walk(p)
            if not found:
                raise FileNotFoundError(f"no .jsonl/.json/.parquet files or datasets in folder {raw}")
            out.extend(found)
        elif p.suffix in DATA_SUFFIXES:
            out.append(p)
        else:
            raise ValueError(f"unsupported data file {raw}: expected .jsonl, .json, .parquet or a folder")
    return list(dict.fromkeys(out))


def _walk(folder: Path, visited: set[Path] | None = None) -> list[Path]:
    """Data files and saved datasets under ``folder``, not descending into saved datasets' internals.

    Linked folders are followed (a data folder of links is common), each real folder once:
    a link back up the tree (``data/a/loop -> ..``) would otherwise recurse until the path is
    too long."""
    visited = set() if visited is None else visited
    real = folder.resolve()
    if real in visited:
        return []
    visited.add(real)
    with explained("cannot read data folder", folder):
        children = sorted(folder.iterdir())
    found: list[Path] = []
    for child in children:
        if child.is_dir():
            found.extend([child] if _is_saved_dataset(child) else _walk(child, visited))
        elif child.suffix in DATA_SUFFIXES:
            found.append(child)
    return found


def _is_saved_dataset(d: Path) -> bool:
    return (d / "dataset_info.json").exists() or (d / "dataset_dict.json").exists()


def read_records(paths: list[str], report: SkipReport, strict: bool = False) -> Iterator[Record]:
    """Yield normalised records; every bad record is counted in ``report`` (or raises if strict)."""
    for path in resolve_files(paths):
        file_kind = None
        for location, raw in _raw_rows(path, report, strict):
            report.read += 1
            kind = record_kind(raw)
            try:
                if file_kind is not None and kind != file_kind:
                    raise DataError(location, "text" if kind == "text" else "messages", "mixed_kinds",
                                    f"{path} began with {file_kind} records and this one is {kind}: "
                                    "put plain text and chats in separate files")
                text = plain_text(raw, location) if kind == "text" else None
                messages = [] if kind == "text" else normalize(raw, location)
            except DataError as err:
                handle(err, report, strict)
                continue
            file_kind = kind
            yield Record(_record_id(raw, path, location), location, messages, text)


def _record_id(raw: dict, path: Path, location: str) -> str:
    rid = raw.get("id")
    if isinstance(rid, (str, int)) and not isinstance(rid, bool):
        return str(rid)
    return f"{path.name}:{location.rsplit(':', 1)[-1]}"


def _raw_rows(path: Path, report: SkipReport, strict: bool) -> Iterator[tuple[str, object]]:
    if path.is_dir():
        yield from _arrow_rows(path)
    elif path.suffix == ".jsonl":
        yield from _jsonl_rows(path, report, strict)
    elif path.suffix == ".json":
        yield from _json_rows(path, report, strict)
    else:
        yield from _parquet_rows(path)


def _jsonl_rows(path: Path, report: SkipReport, strict: bool) -> Iterator[tuple[str, object]]:
    """Line-by-line so each bad line is reported; undecodable lines are counted as read and skipped.
    An unreadable file (permissions, an I/O error mid-read) is one line naming it; only the
    reads are explained, never what the consumer of a yielded row raises."""
    with explained("cannot read data file", path):
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
    with fh:
        lineno = 0
        while True:
            with explained("cannot read data file", path):
                raw = fh.readline()
            if not raw:
                break
            lineno += 1
            if not raw.strip():
                continue
            location = f"{path}:{lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                report.read += 1
                handle(DataError(location, "<line>", "bad_encoding", str(err)), report, strict)
                continue
            try:
                row = json.loads(text)
            except (json.JSONDecodeError, RecursionError) as err:
                report.read += 1
                handle(DataError(location, "<line>", "malformed_json", _json_reason(err)), report, strict)
                continue
            yield location, row


def _json_rows(path: Path, report: SkipReport, strict: bool) -> Iterator[tuple[str, object]]:
    location = f"{path}:1"
    with explained("cannot read data file", path):
        data = path.read_bytes()
    try:
        data = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        report.read += 1
        reason = "bad_encoding" if isinstance(err, UnicodeDecodeError) else "malformed_json"
        handle(DataError(location, "<file>", reason, _json_reason(err)), report, strict)
        return
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        data = [data]
    for i, row in enumerate(data, 1):
        yield f"{path}:{i}", row


def _json_reason(err: Exception) -> str:
    return "nested too deeply" if isinstance(err, RecursionError) else str(err)[:200]


def _parquet_rows(path: Path) -> Iterator[tuple[str, object]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with explained("cannot read data file", path):
            batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    except pa.ArrowException as err:
        raise UserFacingError(f"data file {path}: not a readable Parquet file ({str(err)[:200]}); "
                              f"check or re-export it") from None
    n = 0
    for batch in batches:
        for row in batch.to_pylist():
            n += 1
            yield f"{path}:{n}", row


def _arrow_rows(path: Path) -> Iterator[tuple[str, object]]:
    """A ``save_to_disk`` folder: memory-mapped, read in batches (DatasetDict: every split)."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("", loaded)]
    for split, ds in splits:
        prefix = f"{path}/{split}" if split else str(path)
        for start in range(0, len(ds), 1024):
            batch = ds[start:start + 1024]
            keys = list(batch)
            for j in range(len(batch[keys[0]]) if keys else 0):
                yield f"{prefix}:{start + j + 1}", {k: batch[k][j] for k in keys}
