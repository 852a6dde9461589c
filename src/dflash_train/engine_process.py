"""Running an engine program (llama.cpp's programs, vLLM's runner) so that its failure is one line.

:func:`run_engine_process` starts the program in a session of its own (its own process group), its
output kept in a log file, and waits for it with a per-request timeout. Whatever way it ends badly,
the caller gets one :class:`EngineError` line naming the engine, the program, what happened and the
last lines of its log::

    llama.cpp build 11434: llama-speculative-simple crashed (SIGSEGV); log OUT/llama.cpp/llama-speculative-simple.log ends: ... | ...
    vLLM 0.32.0: the runner ran out of memory (exit 1); log OUT/vllm.log ends: ... | torch.OutOfMemoryError: ...
    vLLM 0.32.0: the runner gave no answer within 600 s (--request-timeout; waiting for: request 3/8); stopped it; log ...

- **missing**: the program cannot be started (``FileNotFoundError``, ``PermissionError``): "cannot start";
- **crashed / killed**: a signal: "crashed (SIGSEGV)", "was killed by SIGKILL (...out-of-memory killer...)";
- **out of memory**: the log's last lines say so (``out of memory``, ``OutOfMemoryError``, ``bad_alloc``,
  ``failed to allocate``...): "ran out of memory (exit N)";
- **exited**: any other exit status but 0: "exited with code N";
- **hangs**: no answer within ``timeout`` seconds. The clock starts with the program and, when the
  program reports progress (it appends lines to the file named by ``$DFLASH_ENGINE_PROGRESS``: vLLM's
  runner, before and after every request), starts again at each line: the timeout is per request.

**No orphans.** The program's whole process group (vLLM's engine core included) is sent SIGTERM, then
SIGKILL, on every way out of the wait: a failure, a timeout, an exception, Ctrl-C, and SIGTERM of our own
process (turned into ``SystemExit(143)`` while an engine runs, so that the ``finally`` runs). What nothing
in our process can catch (a SIGKILL of it, the out-of-memory killer) the group's leader does:
:mod:`dflash_train.engine_guard` starts the program and kills the group within 0.1 s of our death.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from dflash_train import engine_guard
from dflash_train.files import UserFacingError

PROGRESS_ENV = "DFLASH_ENGINE_PROGRESS"  # a file the engine appends a line to at each step (optional)
TAIL_LINES = 5  # the log's last lines the message shows
TAIL_WIDTH = 200  # characters of each of them
KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL of the engine's group
POLL_S = 0.1
# the log's last lines saying the program ran out of memory (llama.cpp/ggml, PyTorch, C++, Python, libc)
OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|MemoryError|bad_alloc|failed to allocate|"
                           r"cannot allocate memory|unable to allocate", re.I)
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


class EngineError(UserFacingError):
    """An engine program failed; the message is one line: engine, program, cause, log tail."""


def log_tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines of ``log`` on one line, `` | `` between them, each cut short."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()][-lines:]
    return " | ".join(line if len(line) <= TAIL_WIDTH else line[: TAIL_WIDTH - 3] + "..." for line in kept)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_cause(returncode: int, log: Path) -> str:
    """What an exit status (and the log's last lines) say happened, completing "<program> ..."."""
    try:
        last = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    except OSError:
        last = ""
    oom = OUT_OF_MEMORY.search(last) is not None
    if returncode < 0:
        name = _signal_name(-returncode)
        if -returncode == signal.SIGKILL:
            return ("ran out of memory (killed by SIGKILL)" if oom else
                    "was killed by SIGKILL (out of memory? the kernel's out-of-memory killer sends it: see dmesg)")
        if oom:
            return f"ran out of memory ({name})"
        return f"crashed ({name})" if -returncode in CRASH_SIGNALS else f"was killed by {name}"
    return f"ran out of memory (exit {returncode})" if oom else f"exited with code {returncode}"


def failure(engine: str, what: str, cause: str, log: Path, error: type[Exception] | None = None) -> Exception:
    """The one line: ``<engine>: <what> <cause>; log <log> ends: <its last lines>``."""
    tail = log_tail(log)
    return (error or EngineError)(f"{engine}: {what} {cause}; log {log} " + (f"ends: {tail}" if tail else "is empty"))


def kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM to ``proc``'s process group (its session: started with ``start_new_session``), SIGKILL to
    what is left after ``grace`` seconds; ``proc`` reaped. Nothing left is not an error."""
    pgid = proc.pid

    def send(sig) -> bool:
        try:
            os.killpg(pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    if send(signal.SIGTERM):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None and not send(0):
                break
            time.sleep(0.05)
        send(signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):  # a process SIGKILL does not end (kernel trouble): leave it
        proc.wait(timeout=10)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside: SIGTERM of this process raises ``SystemExit(143)`` (``finally`` blocks run, the
    engine's group is killed) instead of ending it at once. Only in the main thread (elsewhere: as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _progress_mark(path: Path | None) -> tuple[int, str]:
    """(size, last line) of the progress file; (0, "") when there is none yet."""
    if path is None:
        return 0, ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0, ""
    lines = text.strip().splitlines()
    return len(text), lines[-1].strip() if lines else ""


def _unstartable(program: str) -> str | None:
    """Why ``program`` cannot be started (the ``OSError`` text ``exec`` would give), or None. Checked here:
    the guard, not this process, starts it."""
    path = program if os.sep in program else shutil.which(program)
    if path is None or not os.path.exists(path):
        return os.strerror(2)  # No such file or directory
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return os.strerror(13)  # Permission denied
    return None


def run_engine_process(cmd: list[str], *, engine: str, what: str, log: Path, timeout: float,
                       stdout: Path | None = None, env: dict | None = None, progress: Path | None = None,
                       hint: str = "", error: type[Exception] | None = None) -> None:
    """Run ``cmd`` (the program ``what`` of ``engine``) to its end; its stderr (and stdout, unless
    ``stdout`` names a file for it) into ``log``. Returns when it exits 0; else one :class:`EngineError`
    line (see module doc). ``timeout``: seconds without an answer (the program's end, or a new line in
    ``progress``, whose path the program gets as ``$DFLASH_ENGINE_PROGRESS``). ``hint``: what to do when
    the program cannot be started. ``error``: the exception class raised (default :class:`EngineError`)."""
    error = error or EngineError
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    if progress is not None:
        progress.unlink(missing_ok=True)
        env[PROGRESS_ENV] = str(progress)
    why = _unstartable(cmd[0])
    if why is not None:
        raise error(f"{engine}: cannot start {what} ({cmd[0]}): {why}" + (f"; {hint}" if hint else ""))
    guarded = [sys.executable, "-P", engine_guard.__file__, str(os.getpid()), "--", *cmd]
    with open(log, "w") as err_fh, open(stdout if stdout is not None else os.devnull, "w") as out_fh:
        proc = subprocess.Popen(guarded, stdin=subprocess.DEVNULL, stdout=out_fh if stdout is not None else err_fh,
                                stderr=err_fh, env=env, start_new_session=True)
        try:
            with sigterm_raises():
                mark = _progress_mark(progress)
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        returncode = proc.wait(timeout=POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    now = _progress_mark(progress)
                    if now != mark:
                        mark, deadline = now, time.monotonic() + timeout
                    elif time.monotonic() > deadline:
                        waiting = f"; waiting for: {mark[1]}" if mark[1] else ""
                        kill_group(proc)
                        raise failure(engine, what, f"gave no answer within {timeout:g} s (--request-timeout"
                                      f"{waiting}); stopped it", log, error)
        finally:
            kill_group(proc)  # its children too (vLLM's engine core), on every way out
    if returncode != 0:
        raise failure(engine, what, exit_cause(returncode, log), log, error)
