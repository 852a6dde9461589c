"""Named moments inside the writes a kill can interrupt: where the kill soak aims its SIGKILLs.

``tests/faults/soak.py`` SIGKILLs a training run again and again, resumes it after each kill,
and checks that it ends where an uninterrupted run ends. A kill at a random time almost never
lands inside a write (a checkpoint save is milliseconds of a second-long step), yet those are the
moments a power cut or an OOM kill turns into half-written files. So the writes name them here:

* ``DFLASH_KILL_AT=<point>:<n>``: the process SIGKILLs itself the n-th time it reaches
  ``<point>``, exactly inside that write (nothing after it runs: no ``finally``, no flush);
* ``DFLASH_FAULT_TRACE=<file>``: every point reached is appended to ``<file>``, so a kill at a
  random time can be placed too (after the last point written).

Unset, as in every real run, ``reached`` returns after reading one module global: it costs
nothing, and no behaviour changes.
"""

from __future__ import annotations

import os
import signal

_KILL_AT = os.environ.get("DFLASH_KILL_AT") or None
_TRACE = os.environ.get("DFLASH_FAULT_TRACE") or None
_ACTIVE = _KILL_AT is not None or _TRACE is not None
_counts: dict[str, int] = {}


def reached(point: str, detail: str = "") -> None:
    """The process is at ``point`` (``detail``, e.g. a file name, is appended as ``point:detail``)."""
    if _ACTIVE:
        _arrive(f"{point}:{detail}" if detail else point)


def _arrive(name: str) -> None:
    _counts[name] = _counts.get(name, 0) + 1
    if _TRACE is not None:
        with open(_TRACE, "a") as fh:  # closed (in the kernel) before any kill below
            fh.write(name + "\n")
    if f"{name}:{_counts[name]}" == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
