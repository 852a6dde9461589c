"""One run per folder: a lock file in the run folder, held while a training run lives.

Two runs writing one folder interleave their metrics and race on checkpoint names (issue 39:
both died with ``[Errno 2]``/``[Errno 17]`` on ``step-00000001.tmp``). ``hold_run_folder``
makes the second refuse at once, in one line that names the holder (host, pid, start time,
command), and a lock left by a run that died is taken over with a one-line note.

How the lock is held: ``flock(LOCK_EX | LOCK_NB)`` on the open lock file, not an
``O_CREAT | O_EXCL`` file alone. An exclusive create is atomic too, but it outlives a killed
process, so every start would have to guess whether the named pid is still the holder (pids are
reused; a pid on another host cannot be checked at all). The kernel drops a flock when its
holder dies, however it dies, so "the lock is free" is exact. The file's content (JSON: host,
pid, started, command) is only for the messages. Release unlinks the file while still holding
the flock; an acquirer re-checks that the file it locked is the one at the path (same inode),
which closes the unlink race. Where the file system has no flock (some network file systems
answer ENOLCK/EOPNOTSUPP), the content decides: a holder on this host with a dead pid is
stale and taken over; any other holder is refused, with the lock's path to remove by hand.

Several ranks: only the main rank (``RankInfo.is_main``: the one that writes metrics and the
summary) takes the lock. The run folder is one folder shared by every node (checkpoints are
written into it by all ranks), so a lock per node's local rank 0 would make the nodes refuse
each other; on Linux NFS, flock is carried by the server's byte-range locks, so one lock on a
shared folder also stops a second run started from another node. When the main rank refuses,
it exits with the error and torchrun stops the other ranks.

While the lock is held, no other run writes the folder, so every temporary name in it is
debris of a killed run: those are swept at acquire time (``files.sweep_stale_temps``), and a checkpoint
a killed same-step save had set aside (``step-N.old``) is settled (``run_folder.restore_set_aside``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dflash_train.files import HOST, UserFacingError, explained, os_error_reason, pid_alive, sweep_stale_temps
from dflash_train.run_folder import CHECKPOINTS, COMPILE_ARTIFACTS, LOCK, METRICS, restore_set_aside

try:
    import fcntl
except ImportError:  # not POSIX: the content check alone
    fcntl = None

_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunFolderBusy(UserFacingError):
    """Another live run holds the folder."""


def describe_holder(info: dict | None) -> str:
    if not info:
        return "holder unknown: the lock file is empty or unreadable"
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, int | float) else "?"
    return f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started {when}: {info.get('command', '?')}"


def _read_info(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 1 << 16)
        info = json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _holder_alive(info: dict | None) -> bool:
    """Without flock: is the recorded holder alive? Another host's cannot be checked: yes."""
    if not info or not isinstance(info.get("pid"), int):
        return False
    return info.get("host") != HOST or pid_alive(info["pid"])


# Older temporary names (no owner in them) that only a run in this folder writes: the metrics
# rewrite, the compile artifacts, the preflight's write probe, a checkpoint being saved. Exact
# names, so that a user's own ``*.tmp`` in a run_dir of their choosing (``.``) is never touched.
_RUN_TEMPS = re.compile(rf"^({re.escape(METRICS)}\.tmp|{re.escape(Path(COMPILE_ARTIFACTS).stem)}\.tmp|"
                        r"\.write-test-\d+|step-\d+\.tmp)$")


def _run_folder_temp(path: Path) -> bool:
    return bool(_RUN_TEMPS.match(path.name))


class RunLock:
    """The lock of one run folder; use ``hold_run_folder``."""

    def __init__(self, run_dir: str | Path, echo: Callable[[str], None] = print, command: str | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self.echo = echo
        self.command = command if command is not None else shlex.join(["dflash-train", *sys.argv[1:]])[:300]
        self.fd: int | None = None

    def acquire(self) -> None:
        todo = "set train.run_dir to a folder you can write"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            reason, advice = os_error_reason(err, self.run_dir, todo)
            raise UserFacingError(f"train.run_dir {self.run_dir}: cannot write there: {reason}; {advice}") from None
        if self.path.is_symlink():  # O_CREAT would create the link's target somewhere else
            raise UserFacingError(f"run lock {self.path} is a symbolic link; remove it (a run writes it itself)")
        with explained("cannot lock the run folder", self.path, todo):
            fd, flocked = self._open_locked()
        try:
            previous = _read_info(fd)
            if not flocked and _holder_alive(previous):
                raise RunFolderBusy(self._busy(previous, by_hand=True))
            if previous is not None:
                self.echo(f"dflash-train: took over the lock of {self.run_dir} from a run that stopped without "
                          f"releasing it ({describe_holder(previous)})")
            with explained("cannot write the run lock", self.path, todo):
                self._write_info(fd)
        except BaseException:
            if not isinstance(sys.exc_info()[1], RunFolderBusy):  # ours (locked) or unusable: no debris
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(fd)
            raise
        self.fd = fd
        sweep_stale_temps(self.run_dir, self.echo, _run_folder_temp)
        sweep_stale_temps(self.run_dir / CHECKPOINTS, self.echo, _run_folder_temp)
        restore_set_aside(self.run_dir, self.echo)

    def _open_locked(self) -> tuple[int, bool]:
        """An fd of the lock file at ``self.path`` and whether it is flocked (False: no flock here)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                if fcntl is None:
                    return fd, False
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _read_info(fd)
                os.close(fd)
                raise RunFolderBusy(self._busy(info)) from None
            except OSError as err:
                if err.errno in _NO_FLOCK:
                    return fd, False
                os.close(fd)
                raise
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd, True
            except FileNotFoundError:
                pass
            os.close(fd)  # the holder released (unlinked) it between our open and flock: again

    def _busy(self, info: dict | None, by_hand: bool = False) -> str:
        text = (f"train.run_dir {self.run_dir} is in use by another run ({describe_holder(info)}); "
                f"wait for it to end or stop it, or choose another train.run_dir")
        if by_hand:
            text += f" (if that run is gone, remove {self.path})"
        return text

    def _write_info(self, fd: int) -> None:
        info = {"host": HOST, "pid": os.getpid(), "started": round(time.time(), 3), "command": self.command}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(info) + "\n").encode())
        os.fsync(fd)

    def release(self) -> None:
        """Unlink first, unlock second (see the module docstring)."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)  # drops the flock
        self.fd = None


@contextlib.contextmanager
def hold_run_folder(run_dir: str | Path, enabled: bool = True, echo: Callable[[str], None] = print,
                    command: str | None = None) -> Iterator[RunLock | None]:
    """Hold ``run_dir`` for the body (``enabled=False``: a rank that does not hold it)."""
    if not enabled:
        yield None
        return
    lock = RunLock(run_dir, echo, command)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
