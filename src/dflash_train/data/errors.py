"""Bad-input accounting shared by readers and tokenization.

Every record read is either kept or skipped for a named reason; ``SkipReport`` keeps
the counts and the first few ``file:line`` locations per reason so users can find and
fix their data. ``strict=True`` turns the first skip into a ``DataError`` instead.
Kept records cut at ``data.max_length`` are counted too (a cut is silent otherwise), and
each skip reason is explained in plain words with the setting that controls it (``WHY``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# reason -> why a record was dropped, in plain words, and the setting that decides it (if any)
WHY = {
    "too_few_supervised": "fewer answer tokens (after the cut at data.max_length) than data.min_supervised_tokens "
                          "(default 2 x drafter.block_size): a drafter learns from whole blocks of answer tokens, so "
                          "shorter answers teach it little; lower data.min_supervised_tokens to keep them",
    "mostly_copied": "the answer mostly copies its prompt (prompt lookup drafts more than data.max_lookup_tau tokens "
                     "a step): little for a drafter to learn; raise or unset data.max_lookup_tau to keep them",
    "eval_prompt": "a user turn asks an evaluation prompt (heldout, selection, eval.prompts or "
                   "data.exclude_prompts; equal, contained or near): tau measured on it would be recall, not "
                   "drafting; data.exclude_eval_prompts=false keeps such records",
    "template_mismatch": "the chat template renders the answer differently from the record's text, so its loss "
                         "mask cannot be trusted; check data.chat_template",
    "template_error": "the chat template refused the conversation (e.g. roles that do not alternate); fix the "
                      "record or give another data.chat_template",
    "mixed_kinds": "a file holds both chat records and plain-text records: one kind per file",
    "empty_text": "a plain-text record whose text field is empty",
    "malformed_json": "the line is not valid JSON",
    "bad_encoding": "the bytes are not UTF-8 text",
    "missing_field": "the record has none of messages, conversations, prompt/response or text",
    "wrong_type": "a field has the wrong type (e.g. a number where text belongs)",
    "unknown_role": "a turn's role is none of system, user, assistant, tool",
    "no_assistant_turn": "the conversation has no assistant turn: nothing to learn",
    "empty_conversation": "the conversation has no turns",
    "empty_prompt": "nothing before the last assistant turn to prompt the model with",
    "not_an_object": "the record is not a JSON object",
}


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
    # Kept examples longer than data.max_length, cut to it: how many, the supervised tokens the cut
    # removed, and all supervised tokens of the kept examples before the cut. None: not counted
    # (a report read from an older cache entry).
    truncated: dict[str, int] | None = field(default_factory=lambda: {"records": 0, "tokens": 0, "supervised": 0})

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

    def count_kept(self, was_cut: bool, cut_supervised: int, kept_supervised: int) -> None:
        """One kept example: ``was_cut`` when it was longer than max_length, losing ``cut_supervised``
        of its supervised tokens (it keeps ``kept_supervised``)."""
        t = self.truncated
        if t is None:
            return
        t["supervised"] += kept_supervised + cut_supervised
        if was_cut:
            t["records"] += 1
            t["tokens"] += cut_supervised

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict:
        out = {"read": self.read, "kept": self.kept, "skipped": dict(self.skipped),
               "examples": {k: list(v) for k, v in self.examples.items()}}
        if self.trimmed is not None:
            out["trimmed"] = dict(self.trimmed)
        if self.truncated is not None:
            out["truncated"] = dict(self.truncated)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> SkipReport:
        return cls(read=d["read"], kept=d["kept"], skipped=Counter(d["skipped"]),
                   examples={k: list(v) for k, v in d["examples"].items()}, trimmed=d.get("trimmed"),
                   truncated=d.get("truncated"))

    def format(self) -> str:
        """``data: read R, kept K, skipped S, truncated T``, then a line per skip reason with
        examples and, under it, why such records are dropped and which setting decides it."""
        head = f"data: read {self.read}, kept {self.kept}, skipped {self.total_skipped}"
        t = self.truncated
        if t is not None:
            head += f", truncated {t['records']}"
        lines = [head]
        for reason, count in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {reason}: {count} ({count / max(self.read, 1):.0%} of read)  e.g. "
                         + ", ".join(self.examples.get(reason, [])))
            if reason in WHY:
                lines.append(f"    why: {WHY[reason]}")
        if t is not None and t["records"]:
            lines.append(f"  truncated: {t['records']} kept examples were longer than data.max_length and cut to it, "
                         f"losing {t['tokens']} supervised tokens ({t['tokens'] / max(t['supervised'], 1):.1%} of "
                         "the kept examples' supervised tokens); raise data.max_length to keep them")
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
