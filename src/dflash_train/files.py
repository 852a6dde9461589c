"""File I/O primitives: atomic writes, staged folders, stale-temp sweeps, one-line errors.

Every file the project writes should go through these, for three promises (issue 39):

* **one clear line** on any fault: an ``OSError`` (no space, read-only, permission denied,
  a dangling link, a link loop, an I/O error, ...) becomes a ``UserFacingError`` whose
  text is ``<what> <path>: <reason>; <what to do>``. The CLI prints it without a
  traceback (``dflash_train.cli.main``). ``UserFacingError`` is a ``ValueError``, so every
  CLI that already prints ``ValueError`` as one line prints these too: one mechanism.
* **nothing already written is lost**: a file is written to a temporary name in the same
  folder, flushed and fsync'ed, then renamed over the old one (``os.replace`` is atomic
  on POSIX within one file system), so a crash or a full disk leaves the old version.
* **no debris**: a temporary left by a failure is removed at once; one left by a process
  that was killed (nothing can clean up after SIGKILL) carries its owner's pid and host in
  its name, and ``sweep_stale_temps`` removes it at the next start, with a one-line note.

Temporary names: ``.<name>.tmp-<pid>@<host>-<6 hex>``. The pid and host say whether the
owner is alive (same host, ``kill(pid, 0)``); the hex keeps two writers in one process apart.
Only the standard library is imported here, so that any layer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dflash_train.faultpoints import reached

HOST = socket.gethostname()


class UserFacingError(ValueError):
    """A fault the user can act on; its text is one line and is printed without a traceback."""


# errno -> (reason, what to do). The reason completes "<what> <path>: ..."; the advice is
# generic on purpose: the caller's ``todo`` (e.g. "set train.run_dir elsewhere") goes first.
_REASONS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device", "free space there, or write elsewhere, and rerun"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota, or write elsewhere, and rerun"),
    errno.EROFS: ("the file system is read-only", "choose a writable location"),
    errno.EACCES: ("permission denied", "check its permissions and owner, or choose another location"),
    errno.EPERM: ("operation not permitted", "check its permissions and owner, or choose another location"),
    errno.ENOENT: ("does not exist", "check the path"),
    errno.ELOOP: ("is a symbolic link loop (or too many links deep)", "fix or remove the link"),
    errno.EIO: ("input/output error (a failing disk or a lost network mount)",
                "check the disk or mount (dmesg), then rerun"),
    errno.EISDIR: ("is a folder, not a file", "give a file path"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "check the path"),
    errno.EEXIST: ("already exists", "remove it or choose another path"),
    errno.ENOTEMPTY: ("is a folder that is not empty", "remove it or choose another path"),
    errno.ENAMETOOLONG: ("the name is too long for the file system", "use a shorter path"),
    errno.EMFILE: ("too many open files in this process", "raise the limit (ulimit -n) and rerun"),
    errno.ENFILE: ("too many open files on this system", "close other programs or raise the limit, then rerun"),
    errno.ESTALE: ("stale network file handle (the file changed on the server)", "remount or rerun"),
    errno.EXDEV: ("cannot be moved across file systems", "keep the temporary and final paths on one file system"),
    errno.ETXTBSY: ("is busy (in use by a running program)", "stop that program or choose another path"),
}


# faults of the location (the caller's ``todo``, e.g. "set train.run_dir elsewhere", applies)
_LOCATION = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _link_problem(path: Path) -> str | None:
    """A link that cannot be followed: its target is missing, or the links loop."""
    try:
        if not path.is_symlink():
            return None
        os.stat(path)
    except FileNotFoundError:
        try:
            return f"is a symbolic link to a missing target ({os.readlink(path)})"
        except OSError:
            return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
    return None


def describe_os_error(err: OSError, what: str, path: str | Path | None = None, todo: str = "") -> str:
    """``<what> <path>: <reason>; <what to do>`` for ``err`` (one line)."""
    path = path if path is not None else err.filename
    reason, todo = os_error_reason(err, path, todo)
    where = f" (at {err.filename})" if err.filename and str(err.filename) != str(path) else ""
    text = f"{what}{f' {path}' if path else ''}: {reason}{where}; {todo}"
    return " ".join(text.split())


def os_error_reason(err: OSError, path: str | Path | None, todo: str = "") -> tuple[str, str]:
    """(reason, what to do) for ``err`` about ``path``; ``todo`` wins for faults of the place."""
    reason, advice = _REASONS.get(err.errno, (err.strerror or type(err).__name__, "check the path and rerun"))
    if err.errno in (errno.ENOENT, errno.EEXIST, errno.ELOOP, errno.ENOTDIR) and path:
        link = _link_problem(Path(path))
        reason, advice = (link, "fix or remove the link") if link else (reason, advice)
        if err.errno == errno.EEXIST and not link and Path(path).exists() and not Path(path).is_dir():
            reason, advice = "is a file, not a folder", "remove it or choose another path"
    if todo and err.errno not in _LOCATION:  # the caller's advice is about where to write
        todo = ""
    return reason, todo or advice


def file_error(err: OSError, what: str, path: str | Path | None = None, todo: str = "") -> UserFacingError:
    return UserFacingError(describe_os_error(err, what, path, todo))


@contextlib.contextmanager
def explained(what: str, path: str | Path, todo: str = "") -> Iterator[None]:
    """Any ``OSError`` inside becomes a one-line ``UserFacingError`` about ``path``."""
    try:
        yield
    except UserFacingError:
        raise
    except OSError as err:
        raise file_error(err, what, path, todo) from None


# -- temporary names --------------------------------------------------------------------------
_TEMP = re.compile(r"^\.?(?P<name>.+)\.tmp-(?P<pid>\d+)@(?P<host>.+)-[0-9a-f]{6}$")


def temp_path(final: str | Path) -> Path:
    """A fresh temporary sibling of ``final`` that names its owner (see the module docstring)."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}@{HOST}-{secrets.token_hex(3)}")


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process on this host (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:  # Linux: a zombie (killed, not yet reaped) holds nothing
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _is_stale(path: Path, extra: Callable[[Path], bool] | None) -> bool:
    match = _TEMP.match(path.name)
    if match:
        return match["host"] == HOST and not pid_alive(int(match["pid"]))
    return extra is not None and extra(path)


def sweep_stale_temps(folder: str | Path, echo: Callable[[str], None] | None = None,
                      extra: Callable[[Path], bool] | None = None) -> list[Path]:
    """Remove the temporaries in ``folder`` whose owner is gone and say so in one line.

    A temporary named by ``temp_path`` is stale when its host is this host and its pid is
    dead (one on another host, e.g. a shared cache, is left to that host's next start).
    ``extra(path)`` decides for older names that carry no owner; a caller that holds the
    folder (the run lock) can pass one that says yes to every temporary name it knows."""
    folder = Path(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    stale = [p for p in entries if _is_stale(p, extra)]
    for path in stale:
        _remove(path)
    if stale and echo is not None:
        names = ", ".join(p.name for p in stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        echo(f"dflash-train: removed {len(stale)} stale temporary file(s) in {folder} left by a stopped process: "
             f"{names}")
    return stale


def unwritable(folder: str | Path) -> str | None:
    """Why ``folder`` cannot take a file (made if missing; a probe file written and removed), or None.
    Checked before a long run starts, so a bad folder is one line then, not a failure an hour in."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink(missing_ok=True)
    except OSError as err:
        return err.strerror or str(err).splitlines()[0]
    return None


def note(line: str) -> None:
    """A one-line note on stderr (the default ``echo`` of sweeps outside a run)."""
    print(line, file=sys.stderr)


# -- atomic writes ----------------------------------------------------------------------------
def _fsync_folder(folder: Path) -> None:
    """Make a rename durable: fsync the folder holding it (not possible on every platform)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, what: str = "file", todo: str = "") -> None:
    """Write ``data`` to ``path`` so that a reader sees the old bytes or the new, never a part;
    on any failure the old file is untouched, the temporary removed, and the error one line."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with explained(f"cannot write {what}", path, todo):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            reached("atomic-write", path.name)  # the temporary whole, not yet renamed (the kill soak aims here)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_folder(path.parent)


def atomic_write_text(path: str | Path, text: str, what: str = "file", todo: str = "") -> None:
    atomic_write_bytes(path, text.encode("utf-8"), what, todo)


@contextlib.contextmanager
def staged_folder(final: str | Path, what: str = "folder", todo: str = "",
                  publish: Callable[[Path, Path], None] | None = None) -> Iterator[Path]:
    """Yield a fresh temporary folder next to ``final``; fill it inside the ``with``.

    On success ``publish(tmp, final)`` moves it into place (default: ``os.replace``, which
    refuses a non-empty ``final``); on any failure, in the body or in the publish, the
    temporary is removed and an ``OSError`` becomes a one-line ``UserFacingError``."""
    final = Path(final)
    tmp = temp_path(final)
    try:
        with explained(f"cannot write {what}", final, todo):
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            yield tmp
            (publish or os.replace)(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_folder(final.parent)


# -- reading ----------------------------------------------------------------------------------
def read_text(path: str | Path, what: str = "file", max_bytes: int | None = None, todo: str = "") -> str:
    """UTF-8 text of ``path`` or one line saying why not (missing, dangling, a loop, a folder,
    unreadable, too large, not UTF-8)."""
    path = Path(path)
    with explained(f"cannot read {what}", path, todo), open(path, "rb") as fh:
        data = fh.read(max_bytes + 1 if max_bytes is not None else -1)
    if max_bytes is not None and len(data) > max_bytes:
        raise UserFacingError(f"{what} {path}: larger than {max_bytes} bytes; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        hint = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise UserFacingError(f"{what} {path}: not UTF-8 text{hint}: byte {data[err.start]:#04x} at offset "
                              f"{err.start}; save it as UTF-8") from None



def read_json(path: str | Path) -> dict:
    """A JSON object file (a model folder's ``config.json``, ...): ``FileNotFoundError`` when missing,
    ``ValueError`` naming it when it is not a JSON object; read through :func:`read_text` (64 MiB cap)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"{path} not found")
    text = read_text(path, "file", max_bytes=64 << 20)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data

def write_figure(fig, path: str | Path, what: str, todo: str = "", dpi: int = 100) -> Path:
    """A matplotlib figure as a PNG: rendered in memory (the figure closed either way), then
    written atomically, so a failure is one line naming ``path`` and an earlier plot stays intact."""
    import io

    import matplotlib.pyplot as plt

    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, png.getvalue(), what, todo)
    return Path(path)


# -- integrity: checksums of a folder's files, verified when it is read back -----------------------
CHECKSUMS = "checksums.json"  # {relative path: {"sha256", "bytes"}}, written last into the folder


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """``{relative path: {"sha256", "bytes"}}`` of every file under ``folder`` (but the checksum
    file and the names in ``skip``). hashlib releases the GIL on large buffers, so a few threads
    hash the files in parallel: the cost stays about one read of the folder."""
    names = {CHECKSUMS, *skip}
    found = sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name not in names)
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(found)))) as pool:
        digests = list(pool.map(sha256_file, found))
    return {str(p.relative_to(folder)): {"sha256": d, "bytes": p.stat().st_size} for p, d in zip(found, digests)}


def verify_checksums(folder: Path, missing_ok: bool = False, raise_os_errors: bool = False) -> str | None:
    """None when every file ``checksums.json`` names matches it, else what is wrong (one line).
    No checksum file is a problem unless ``missing_ok`` (folders written before they carried
    one). A file that cannot be read, a malformed checksum file or one naming a file outside the
    folder is a problem too, never an exception; with ``raise_os_errors`` a read that fails is
    the caller's ``OSError`` (a fault of the place, such as permissions, is not damaged bytes)."""
    folder = Path(folder)
    if not (folder / CHECKSUMS).exists():
        return None if missing_ok else f"{CHECKSUMS} is missing"
    try:
        expected = json.loads((folder / CHECKSUMS).read_text())
    except (ValueError, RecursionError) as err:
        return f"{CHECKSUMS} is unreadable ({' '.join(str(err).split())[:120]})"
    except OSError as err:
        if raise_os_errors:
            raise
        return f"{CHECKSUMS} cannot be read ({err.strerror})"
    if not _checksums_well_formed(expected):
        return f"{CHECKSUMS} is malformed (expected {{file: {{sha256, bytes}}}} of files inside the folder)"
    try:
        for name, want in sorted(expected.items()):
            file = folder / name
            if not file.is_file():
                return f"{name} is missing"
            size = file.stat().st_size
            if size != want["bytes"]:
                return f"{name} has {size} bytes, {want['bytes']} were written"
        for name, want in sorted(expected.items()):
            if sha256_file(folder / name) != want["sha256"]:
                return f"{name} does not match its sha256 checksum (its bytes changed after it was written)"
    except OSError as err:
        if raise_os_errors:
            raise
        return f"{Path(err.filename or '?').name} cannot be read ({err.strerror})"
    return None


def _checksums_well_formed(expected) -> bool:
    if not isinstance(expected, dict):
        return False
    for name, want in expected.items():
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            return False
        if not (isinstance(want, dict) and isinstance(want.get("sha256"), str)
                and isinstance(want.get("bytes"), int) and not isinstance(want.get("bytes"), bool)):
            return False
    return True


# -- integrity of one JSON object: a checksum field inside it ---------------------------------
# A run folder's JSON files (config.json, summary.json, tracking.json) and each metrics.jsonl line
# are rewritten or appended in one write; a sidecar checksum would be a second write that a kill
# can leave out of step with the first. So the checksum rides inside the object, as its first
# field: the sha256 (its first ``digits`` hex digits) of the very text written, with the field's
# own value zeroed. Read back, the text is hashed the same way: no re-serialization is trusted.
SEAL = "_sha256"
_SEAL_HEAD = re.compile(r'\{\s*"' + SEAL + r'": "([0-9a-f]{8,64})"')
UNSEALED = "unsealed"  # the object has no checksum field: written before files carried one
_noted: set[str] = set()


class SealMismatch(UserFacingError):
    """A sealed JSON text whose bytes changed after it was written."""


def seal_json(obj: dict, indent: int | None = None, digits: int = 64) -> str:
    """``obj`` as JSON text carrying its own checksum (``_sha256``, first); an old ``_sha256``
    in ``obj`` (an object read back and rewritten) is replaced."""
    blank = "0" * digits
    text = json.dumps({SEAL: blank, **{k: v for k, v in obj.items() if k != SEAL}}, indent=indent)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:digits]
    return text.replace(f'"{SEAL}": "{blank}"', f'"{SEAL}": "{digest}"', 1)


def unseal_json(text: str) -> tuple[object, str | None]:
    """``(object without its checksum field, None)`` when the checksum matches the text;
    ``(object, UNSEALED)`` for a text without one (an older writer); ``(None, why)`` when the
    bytes changed after they were written. Text that is not JSON raises ``ValueError`` as
    ``json.loads`` does."""
    head = _SEAL_HEAD.match(text)
    if head is None:
        obj = json.loads(text)
        if isinstance(obj, dict) and SEAL in obj:  # the field is there but its value is not hex
            return None, f"its checksum field {SEAL} is damaged"
        return obj, UNSEALED
    digits = len(head[1])
    zeroed = text[:head.start(1)] + "0" * digits + text[head.end(1):]
    if hashlib.sha256(zeroed.encode("utf-8")).hexdigest()[:digits] != head[1]:
        return None, "does not match its checksum (its bytes changed after it was written)"
    obj = json.loads(text)
    if isinstance(obj, dict):
        obj.pop(SEAL, None)
    return obj, None


def note_once(line: str, echo: Callable[[str], None] | None = None) -> None:
    """``line`` on ``echo`` (stderr by default) the first time this process says it."""
    if line not in _noted:
        _noted.add(line)
        (echo or note)(line)


def read_sealed_json(path: str | Path, what: str = "file", echo: Callable[[str], None] | None = None):
    """The JSON object in ``path``, its checksum verified. A mismatch is ``SealMismatch`` (one
    line naming the file); a file without a checksum (an older version wrote it) loads, with a
    note the first time; unreadable: ``OSError``/``UserFacingError``; not JSON: ``ValueError``."""
    path = Path(path)
    obj, problem = unseal_json(read_text(path, what))
    if problem == UNSEALED:
        note_once(f"dflash-train: note: {what} {path} carries no checksum (written by an older version); "
                  f"read as it is", echo)
    elif problem is not None:
        raise SealMismatch(f"{what} {path} {problem}")
    return obj


# -- integrity of one large file: a ``<name>.sha256`` beside it ----------------------------------
# For a file whose format has no room of ours (a GGUF that llama.cpp reads). The sidecar is in
# ``sha256sum`` format (``sha256sum -c`` checks it too). Writers: ``forget_sidecar`` before the file
# is replaced (a stale sidecar would fail a good file), ``write_sidecar`` after. A file without a
# sidecar is not ours, or predates them: it is read as it is.
def sidecar_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def forget_sidecar(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        sidecar_path(path).unlink()


def write_sidecar(path: str | Path, what: str = "checksum", todo: str = "") -> None:
    path = Path(path)
    atomic_write_text(sidecar_path(path), f"{sha256_file(path)}  {path.name}\n", what, todo)


def verify_sidecar(path: str | Path) -> str | None:
    """None when ``path`` matches its ``.sha256`` sidecar (or has none), else what is wrong."""
    path, sidecar = Path(path), sidecar_path(path)
    if not sidecar.is_file():
        return None
    try:
        want = sidecar.read_text().split()[0] if sidecar.read_text().strip() else ""
        got = sha256_file(path)
    except OSError as err:
        return f"cannot be read to verify it ({err.strerror})"
    if got != want:
        return f"does not match its checksum {sidecar.name} (its bytes changed after it was written)"
    return None


def verify_export(folder: str | os.PathLike) -> None:
    """The exported folder's files against the ``checksums.json`` the export wrote last, before our
    loader, llama.cpp's GGUF writer or vLLM reads them: weights whose bytes changed but still parse
    would serve silently wrong drafts. A mismatch is one line naming the file. A folder without it
    (a published drafter, an older export) is read as it is. The engines never read the extra
    file: vLLM and SGLang read ``config.json`` and ``*.safetensors``, llama.cpp's converter those
    and the tokenizer's files."""
    problem = verify_checksums(Path(folder), missing_ok=True)
    if problem is not None:
        raise UserFacingError(f"exported drafter {folder}: {problem}; export it again (a file edited on purpose: "
                              f"remove {CHECKSUMS})")
