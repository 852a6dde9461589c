"""Runs an engine program so that it never outlives the process that started it, even a SIGKILLed one.

    python -P engine_guard.py PARENT_PID -- PROGRAM [ARGS ...]

:func:`dflash_train.engine_process.run_engine_process` starts this file (not the program) as the leader
of a new session; the guard starts the program in the same process group and waits for it. Every
``POLL_S`` it checks that ``PARENT_PID`` is still its parent: when our process dies in a way nothing can
catch (SIGKILL, the out-of-memory killer, a power-cut of the container's init), the guard is re-parented
and SIGKILLs the whole group (the program and its children: vLLM's engine core) with itself.

The guard is invisible otherwise: it ends the way the program ended (the same exit code, or killed by the
same signal), so the caller reads the program's fate from the guard's. A SIGTERM or SIGKILL sent to the
group reaches the program directly. Standard library only, run by path with ``-P``: it must start fast
and must not import the package (vLLM's runner runs with another Python's environment).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

POLL_S = 0.1  # how soon an orphaned program is killed after our process died


def end_like(returncode: int) -> None:
    """Exit as the program did: its code, or (a negative return code) die by its signal."""
    if returncode < 0:
        sig = -returncode
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two whose action cannot be changed
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        sys.exit(128 + sig)  # a signal that does not end a process by default (SIGCHLD...)
    sys.exit(returncode)


def guard(parent: int, cmd: list[str]) -> None:
    """Start ``cmd`` and wait; SIGKILL the process group as soon as ``parent`` is no longer our parent."""
    if os.getppid() != parent:  # our process died while this one started
        os.killpg(0, signal.SIGKILL)
    try:
        proc = subprocess.Popen(cmd)
    except OSError as err:
        print(f"cannot start {cmd[0]}: {err.strerror or err}", file=sys.stderr)
        sys.exit(127)
    while True:
        try:
            end_like(proc.wait(timeout=POLL_S))
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: engine_guard.py PARENT_PID -- PROGRAM [ARGS ...]")
    guard(int(sys.argv[1]), sys.argv[3:])
