"""One SIGTERM/SIGINT policy for every process of a job: finish what is in flight, then stop.

The first signal calls ``on_first(name)`` (the trainer asks to stop after its step; a target
rank keeps serving until the drafters stop). A second signal aborts (``KeyboardInterrupt``),
unless it comes within ``echo_window`` seconds of the first: a Ctrl-C under torchrun reaches a
worker twice (from the terminal and forwarded by torchrun) within milliseconds, and that is
one request, not two.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable


class StopOnSignals:
    def __init__(self, on_first: Callable[[str], None], echo_window: float = 2.0):
        self.on_first = on_first
        self.echo_window = echo_window
        self.first_signal: float | None = None
        self.previous: dict = {}

    def _handler(self, signum, frame):
        now = time.monotonic()
        if self.first_signal is None:
            self.first_signal = now
            self.on_first(signal.Signals(signum).name)
        elif now - self.first_signal > self.echo_window:
            raise KeyboardInterrupt

    def __enter__(self) -> StopOnSignals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers
                self.previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False
