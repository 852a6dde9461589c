"""Bad-input accounting shared by readers and tokenization.

Every record read is either kept or skipped for a named reason; ``SkipReport`` keeps
the counts and the first few ``file:line`` locations per reason so users can find and
fix their data. ``strict=True`` turns the first skip into a ``DataError`` instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


class DataError(ValueError):
    """A record the user must fix: names the file, line and offending field."""

    def __init__(self, location: str, field_name: str, reason: str, detail: str = ""):
        self.location, self.field, self.reason = location, field_name, reason
        msg = f"{location}: field '{field_name}': {reason}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


@dataclass
class SkipReport:
    """Counts read / kept / skipped-by-reason with up to ``max_examples`` locations each."""

    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    max_examples: int = 5
    # data.trim_loops (data/loops.py): looping tails cut from kept examples, the supervised
    # tokens they held, and all supervised tokens of the kept examples before the cut.
    # None: the option was off, nothing to report.
    trimmed: dict[str, int] | None = None

    def skip(self, err: DataError) -> None:
        self.skipped[err.reason] += 1
        shown = self.examples.setdefault(err.reason, [])
        if len(shown) < self.max_examples:
            shown.append(f"{err.location} ({err.field})")

    def count_trimmed(self, tails: int, removed: int, kept_supervised: int) -> None:
        """One kept example after loop trimming: ``removed`` of its supervised tokens went."""
        t = self.trimmed = self.trimmed or {"tails": 0, "tokens": 0, "supervised": 0}
        t["tails"] += tails
        t["tokens"] += removed
        t["supervised"] += kept_supervised + removed

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict:
        out = {"read": self.read, "kept": self.kept, "skipped": dict(self.skipped),
               "examples": {k: list(v) for k, v in self.examples.items()}}
        if self.trimmed is not None:
            out["trimmed"] = dict(self.trimmed)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> SkipReport:
        return cls(read=d["read"], kept=d["kept"], skipped=Counter(d["skipped"]),
                   examples={k: list(v) for k, v in d["examples"].items()}, trimmed=d.get("trimmed"))

    def format(self) -> str:
        lines = [f"data: read {self.read}, kept {self.kept}, skipped {self.total_skipped}"]
        for reason, count in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {reason}: {count}  e.g. " + ", ".join(self.examples.get(reason, [])))
        if self.trimmed is not None:
            t = self.trimmed
            lines.append(f"  trimmed {t['tails']} looping tails, {t['tokens']} tokens "
                         f"({t['tokens'] / max(t['supervised'], 1):.1%} of supervised tokens)")
        return "\n".join(lines)


def handle(err: DataError, report: SkipReport, strict: bool) -> None:
    """Raise in strict mode, otherwise count the skip; the single policy point."""
    if strict:
        raise err
    report.skip(err)
