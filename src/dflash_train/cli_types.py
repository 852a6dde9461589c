"""Range-checked argparse types for numeric flags: ``add_argument("--limit", type=positive_int)``.

A flag out of range (``eval --limit 0`` evaluated anyway, issue 39) is refused before any
work, in one line that names the flag: argparse puts the flag in front of the message
(``argument --limit: must be an integer >= 1, got 0``) and ``cli.OneLineParser`` prints it
without the usage block. NaN and infinities are refused for every float type.

The one home of these types (``eval/flags.py``, a second copy for the eval and benchmark CLIs, merged
here; its names stay as aliases: ``at_least``, ``nonnegative_int``, ``nonnegative_float``,
``probability``, ``float_at_least``). It sits in the lowest layer (``scripts/import_graph.py``), so
every command module can use it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") \
            from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""

    def parse(text: str) -> int:
        value = _number(text, int)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its own messages
    return parse


def float_in(low: float | None = None, high: float | None = None, low_open: bool = False,
             high_open: bool = False) -> Callable[[str], float]:
    """A finite float in the interval (``*_open``: the bound itself excluded; None: unbounded)."""
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"

    def parse(text: str) -> float:
        value = _number(text, float)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be in {span}, got {text}")
        return value

    parse.__name__ = f"number in {span}"
    return parse


def comma_separated_ints(text: str) -> list[int]:
    """``"1,9,17"`` -> ``[1, 9, 17]`` (layer ids and the like)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)
positive_float = float_in(0.0, low_open=True)
nonneg_float = float_in(0.0)
fraction = float_in(0.0, 1.0, low_open=True)  # (0, 1]: e.g. top-p
unit_interval = float_in(0.0, 1.0)  # [0, 1]

# the names of the former eval/flags.py
at_least = int_at_least
nonnegative_int = nonneg_int
nonnegative_float = nonneg_float
probability = fraction  # (0, 1]: a top-p


def float_at_least(low: float) -> Callable[[str], float]:
    """Finite floats >= ``low``."""
    return float_in(low)


def register_tool(sub, name: str, help: str, doc: str, add_arguments: Callable, run: Callable):
    """Add a tool module as ``dflash-train NAME``: its module docstring as the description, its
    ``add_arguments(parser)`` flags, ``run(args)`` as the command. Returns the sub-parser."""
    parser = sub.add_parser(name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def tool_parser(doc: str, add_arguments: Callable) -> argparse.ArgumentParser:
    """The same tool's stand-alone parser (``python -m``): the docstring's first line as description."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_arguments(parser)
    return parser
