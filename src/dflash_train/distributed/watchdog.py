"""A per-rank watchdog: a hang becomes a failure that says which rank stopped, and where.

A distributed job that deadlocks prints nothing: every rank waits inside a collective for a
peer that will never come, until the collective timeout (30 minutes by default) or forever
(a wait that is not a collective, e.g. inside ``new_group``). So every rank runs a small
thread that expects a heartbeat (``beat``) from the code that makes progress: start-up
phases, every training step, every feature batch a target rank serves. When none arrives in
time it prints one line naming the rank, its role and the last phase it reached, then the
Python stack of every thread of that rank (``faulthandler``, each line prefixed ``[rank N]``), and ends the rank with exit
code 70 so that torchrun tears the job down. Ranks that hang together (one waits for the
other) each print their own stacks: the thread waits a few seconds before exiting.

Two budgets: start-up (loading, data cache, the first step's compilation) may legitimately
take minutes; after the first step a step that takes longer than ``DFLASH_WATCHDOG_SECONDS``
(default 600) is a hang. ``DFLASH_WATCHDOG_START_SECONDS`` (default 1800) bounds start-up.
``0`` disables. A C-level ``faulthandler.dump_traceback_later`` backs the thread up in case the
hung call never releases the GIL (the thread could then never run).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time

EXIT_CODE = 70  # EX_SOFTWARE
GRACE_S = 3.0  # before exiting: lets the other hung ranks print their stacks too
BACKSTOP_S = 60.0  # the C-level dump fires this long after the thread should have


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default) or 0)


class Watchdog:
    def __init__(self, rank: int, role: str, start_seconds: float, step_seconds: float, stream=None):
        self.rank, self.role = rank, role
        self.start_seconds, self.step_seconds = start_seconds, step_seconds
        self.stream = stream or sys.stderr
        self.limit = start_seconds
        self.phase = "start-up"
        self.last = time.monotonic()
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"dflash-watchdog-{rank}", daemon=True)

    @classmethod
    def from_env(cls, rank: int, role: str) -> Watchdog:
        return cls(rank, role, _seconds("DFLASH_WATCHDOG_START_SECONDS", 1800),
                   _seconds("DFLASH_WATCHDOG_SECONDS", 600))

    @property
    def enabled(self) -> bool:
        return self.start_seconds > 0 and self.step_seconds > 0

    def start(self) -> Watchdog:
        if self.enabled:
            self._thread.start()
        return self

    def beat(self, phase: str, steady: bool = False, long: bool = False) -> None:
        """Progress: ``phase`` says where this rank is; ``steady`` switches to the step budget
        (call it after the first step, whose compilation belongs to start-up); ``long`` back
        to the start-up budget, for phases that legitimately take minutes (a held-out
        evaluation, a checkpoint) while other ranks wait for them."""
        self.phase = phase
        self.last = time.monotonic()
        if steady:
            self.limit = self.step_seconds
        if long:
            self.limit = self.start_seconds

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        faulthandler.cancel_dump_traceback_later()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.limit / 4)):
            idle = time.monotonic() - self.last
            if idle < self.limit:
                # Re-armed while healthy; fires only if this thread itself stops running.
                faulthandler.dump_traceback_later(self.limit - idle + BACKSTOP_S, exit=True, file=self.stream)
                continue
            self._fire(idle)
            return

    def _fire(self, idle: float) -> None:
        self.fired = True
        faulthandler.cancel_dump_traceback_later()
        print(f"dflash-train watchdog: rank {self.rank} ({self.role}) made no progress for {idle:.0f} s "
              f"(limit {self.limit:.0f} s); last phase: {self.phase}. Stacks of rank {self.rank}:",
              file=self.stream, flush=True)
        self.dump_stacks()
        time.sleep(GRACE_S)
        os._exit(EXIT_CODE)

    def dump_stacks(self) -> None:
        """Every thread's stack, each line prefixed with this rank and written whole. Ranks that
        hang together fire within the same second into the one stderr torchrun collects, and
        faulthandler writes a frame line in several pieces, so two ranks' stacks interleaved
        mid-line (``File ...`` of one rank, `` in <function>`` of the other). Each line here is one
        write of less than a pipe's atomic size (PIPE_BUF, 4096 bytes), and says whose it is."""
        try:
            with tempfile.TemporaryFile() as dump:  # faulthandler needs a real file descriptor
                faulthandler.dump_traceback(file=dump, all_threads=True)
                dump.seek(0)
                text = dump.read().decode("utf-8", "replace")
        except OSError:  # no temporary file (a full disk): the stacks unprefixed rather than none
            faulthandler.dump_traceback(file=self.stream, all_threads=True)
            self.stream.flush()
            return
        for line in text.splitlines():
            self.stream.write(f"[rank {self.rank}] {line}\n")
            self.stream.flush()


_current: Watchdog | None = None


def start(rank: int, role: str) -> Watchdog:
    """Start this process's watchdog (one per rank; a second call replaces the first)."""
    global _current
    if _current is not None:
        _current.stop()
    _current = Watchdog.from_env(rank, role).start()
    return _current


def beat(phase: str, steady: bool = False, long: bool = False) -> None:
    """Report progress to this process's watchdog (nothing when none runs)."""
    if _current is not None:
        _current.beat(phase, steady, long)


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current = None
