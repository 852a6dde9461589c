"""Range-checked numeric command-line flags (argparse ``type=`` validators).

A value out of range ends the command with argparse's one line naming the flag
(``argument --limit: must be an integer >= 1, got 0``) before any model loads, instead of a
run that silently does something else (``--limit 0`` once evaluated every prompt).
"""

from __future__ import annotations

import argparse
import math


def _bounded(kind: type, low: float | None, high: float | None, low_open: bool):
    noun = "an integer" if kind is int else "a number"
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"<= {high:g}")
    rule = f"{noun} {' and '.join(parts)}".strip()

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {rule} (finite), got {text!r}")
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    parse.__name__ = f"{kind.__name__} ({rule})"  # what argparse names when it fails otherwise
    return parse


def at_least(low: int):
    """Integers >= ``low``."""
    return _bounded(int, low, None, False)


positive_int = at_least(1)
nonnegative_int = at_least(0)
positive_float = _bounded(float, 0.0, None, True)
nonnegative_float = _bounded(float, 0.0, None, False)
probability = _bounded(float, 0.0, 1.0, True)  # (0, 1]: a top-p


def float_at_least(low: float):
    """Finite floats >= ``low``."""
    return _bounded(float, low, None, False)
