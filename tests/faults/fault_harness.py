"""The fault-injection harness (issue 39): drives read/write points through file-system faults.

No root and no mounts: errors are *injected* (tests run as root in CI, where chmod stops
nothing), links are real (a dangling link and a loop behave the same for root), and bad
content is written as bytes. A point is one place that reads or writes a file, described by
a ``Point``; ``drive(point, fault, tmp_path)`` runs it under one fault and fails on

* a traceback: anything but a ``ValueError`` (``files.UserFacingError`` is one) whose text is
  one line naming the file -- what ``dflash_train.cli.main`` prints as one line;
* a silent wrong result: the point's ``check`` after a fault it should survive (a corrupt
  cache is rebuilt: the rows must be the right ones);
* data lost: a file listed by ``keep`` changed after a failed write;
* debris: a temporary name (``*.tmp``, ``*.tmp-*``, ``.write-test-*``) left under ``tmp_path``.

Adding a point (the integrator, after the merge: checkpoints, export, eval prompts,
regeneration output, data readers) is one ``Point(...)`` entry in a test's ``POINTS`` list.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

WRITE_ERRNOS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS, "EACCES": errno.EACCES, "EIO": errno.EIO,
                "EDQUOT": errno.EDQUOT}
READ_ERRNOS = {"EACCES": errno.EACCES, "EIO": errno.EIO}
# where a write fails: making the file/folder, writing its bytes, or renaming it into place
STAGES = ("create", "write", "publish")
LINK_FAULTS = ("missing", "dangling-link", "link-loop", "a-folder")
CONTENT_FAULTS = ("truncated", "garbage", "latin-1", "utf-16", "deep-nesting", "huge-line", "wrong-types")


@dataclass
class Point:
    """One place that reads or writes a file.

    setup(tmp) -> ctx: builds the inputs (and, for writes, an earlier version that must survive).
    act(ctx) -> result: runs the point.
    target(ctx) -> Path: the file the point reads (link/content faults replace it) or writes.
    names(ctx) -> str: text a one-line error must contain (default: the target's name).
    check(ctx, result): the result of a successful run is right (None: not checked).
    content: valid bytes of the target (content faults derive theirs from it); None: not a reader.
    on_content: "error" (one line) or "recover" (the point repairs it: ``check`` must pass).
    deep: bytes nested too deeply for a recursive parser.
    wrong_types: bytes of well-formed files with wrong types in them.
    write_hooks: (object, attribute) pairs that do the "write" stage in C (pyarrow): made to raise.
    keep(ctx) -> [Path]: files whose bytes a failed write must leave as they were.
    """

    name: str
    setup: Callable[[Path], Any]
    act: Callable[[Any], Any]
    target: Callable[[Any], Path]
    names: Callable[[Any], str] | None = None
    check: Callable[[Any, Any], None] | None = None
    writes: bool = False
    content: Callable[[Any], bytes] | None = None
    on_content: str = "error"
    deep: bytes = b"[" * 200_000
    wrong_types: list[bytes] = field(default_factory=list)
    write_hooks: list[tuple[Any, str]] = field(default_factory=list)
    keep: Callable[[Any], list[Path]] = lambda ctx: []
    wrong_type_names: list[str] = field(default_factory=list)  # what each wrong-types error names
    on_link: str = "error"  # link faults: "error" (one line) or "recover" (``check`` must pass)
    faults: list[str] | None = None  # None: every fault that applies (``faults_for``)


def _is_under(path, root: Path) -> bool:
    try:
        return Path(os.fsdecode(path)).resolve(strict=False).is_relative_to(root.resolve())
    except (TypeError, ValueError, OSError):
        return False


def _raise(code: int, path) -> None:
    raise OSError(code, os.strerror(code), os.fsdecode(path) if path is not None else None)


@contextlib.contextmanager
def inject(monkeypatch, root: Path, code: int, stage: str, hooks=()):
    """Calls that touch files under ``root`` fail with ``code`` at ``stage`` (see STAGES, or
    "read": opening a file for reading)."""
    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir
    real_write, real_replace, real_rename = os.write, os.replace, os.rename
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def fake_open(file, mode="r", *args, **kwargs):
        wants_write = any(c in mode for c in "wax+")
        if isinstance(file, str | bytes | os.PathLike) and _is_under(file, root):
            if (stage == "create" and wants_write) or (stage == "read" and not wants_write):
                _raise(code, file)
            if stage == "write" and wants_write:
                handle = real_open(file, mode, *args, **kwargs)
                handle.close()
                _raise(code, file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        wanted = (stage == "create" and flags & writing) or (stage == "read" and not flags & writing)
        if wanted and _is_under(path, root):
            _raise(code, path)
        return real_os_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if stage == "create" and _is_under(path, root):
            _raise(code, path)
        return real_mkdir(path, *args, **kwargs)

    def fake_write(fd, data):
        if stage == "write":
            _raise(code, None)
        return real_write(fd, data)

    def fake_move(real):
        def move(src, dst, *args, **kwargs):
            if stage == "publish" and _is_under(dst, root):
                _raise(code, dst)
            return real(src, dst, *args, **kwargs)
        return move

    def failing_hook(*args, **kwargs):
        _raise(code, None)

    with monkeypatch.context() as m:
        for module in (builtins, io):
            m.setattr(module, "open", fake_open)
        m.setattr(os, "open", fake_os_open)
        m.setattr(os, "mkdir", fake_mkdir)
        m.setattr(os, "write", fake_write)
        m.setattr(os, "replace", fake_move(real_replace))
        m.setattr(os, "rename", fake_move(real_rename))
        if stage == "write":
            for owner, attr in hooks:
                m.setattr(owner, attr, failing_hook)
        yield


def temp_debris(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if ".tmp" in p.name or p.name.startswith(".write-test-"))


def assert_one_line(err: BaseException, must_name: str) -> None:
    """What the CLI prints as one line: a ValueError (or an OSError raised with a message and no
    errno, e.g. ``FileNotFoundError("no config file ...")``) with one line of text naming the file."""
    text = str(err)
    explained = isinstance(err, ValueError) or (isinstance(err, OSError) and err.errno is None)
    assert explained, f"{type(err).__name__} escapes (a traceback): {text}"
    assert "\n" not in text.strip(), f"not one line: {text!r}"
    assert must_name in text, f"the message does not name {must_name!r}: {text!r}"
    assert "Traceback" not in text and "[Errno" not in text, f"a raw error, not explained: {text!r}"


def content_bytes(point: Point, ctx, fault: str) -> list[bytes]:
    good = point.content(ctx)
    if fault == "truncated":
        return [good[: max(1, len(good) // 2)]]
    if fault == "garbage":
        return [bytes(range(256)) * 4]
    if fault == "latin-1":  # the same text with one accented letter, saved as latin-1
        return [good.decode("utf-8").replace('"', '"caf\u00e9 ', 1).encode("latin-1") if b'"' in good
                else "caf\u00e9".encode("latin-1") + good]
    if fault == "utf-16":
        return [good.decode("utf-8").encode("utf-16")]
    if fault == "deep-nesting":
        return [point.deep]
    if fault == "huge-line":
        return [b"x" * (50 << 20)]
    return point.wrong_types


def _snapshot(paths: list[Path]) -> dict[Path, bytes | None]:
    return {p: p.read_bytes() if p.is_file() else None for p in paths}


def drive(point: Point, fault: str, tmp_path: Path, monkeypatch) -> None:
    """Run ``point`` under ``fault`` and fail on a traceback, a wrong result, lost data or debris.

    ``fault``: ``write:<ERRNO>:<stage>``, ``read:<ERRNO>``, one of LINK_FAULTS, or one of
    CONTENT_FAULTS."""
    ctx = point.setup(tmp_path)
    must_name = point.names(ctx) if point.names else point.target(ctx).name
    before_debris = set(temp_debris(tmp_path))
    kind = fault.split(":")[0]
    if kind in ("write", "read"):
        _, code_name, *stage = fault.split(":")
        code = (WRITE_ERRNOS if kind == "write" else READ_ERRNOS)[code_name]
        kept = _snapshot(point.keep(ctx))
        with pytest.raises(Exception) as caught, inject(monkeypatch, tmp_path, code, stage[0] if stage else "read",
                                                        point.write_hooks):
            point.act(ctx)
        assert_one_line(caught.value, must_name)
        assert _snapshot(list(kept)) == kept, "a failed write changed a file that was already there"
    elif fault in LINK_FAULTS:
        target = point.target(ctx)
        _remove(target)
        if fault == "dangling-link":
            target.symlink_to(target.with_name("nowhere"))
        elif fault == "link-loop":
            target.symlink_to(target.name)
        elif fault == "a-folder":
            target.mkdir()
        _expect(point, ctx, point.on_link, must_name)
    else:
        names = point.wrong_type_names if fault == "wrong-types" else []
        for i, data in enumerate(content_bytes(point, ctx, fault)):
            point.target(ctx).write_bytes(data)
            _expect(point, ctx, point.on_content, names[i] if i < len(names) else must_name)
    assert set(temp_debris(tmp_path)) <= before_debris, f"debris: {set(temp_debris(tmp_path)) - before_debris}"


def _expect(point: Point, ctx, outcome: str, must_name: str) -> None:
    if outcome == "recover":
        result = point.act(ctx)
        if point.check:
            point.check(ctx, result)
        return
    with pytest.raises(Exception) as caught:
        point.act(ctx)
    assert_one_line(caught.value, must_name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def faults_for(point: Point) -> list[str]:
    """Every fault that applies to ``point``."""
    if point.faults is not None:
        return list(point.faults)
    out = []
    if point.writes:
        out += [f"write:{e}:{s}" for e in WRITE_ERRNOS for s in STAGES]
    if point.content is not None:
        out += [f"read:{e}" for e in READ_ERRNOS] + list(LINK_FAULTS) + list(CONTENT_FAULTS)
    return out


def cases(points: list[Point]) -> list:
    """``pytest.param(point, fault)`` for every point x its faults, with readable ids."""
    return [pytest.param(p, f, id=f"{p.name}-{f}") for p in points for f in faults_for(p)
            if f != "wrong-types" or p.wrong_types]
