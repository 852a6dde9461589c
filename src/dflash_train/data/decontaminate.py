"""Keep evaluation prompts out of training data.

A drafter trained on the answer to a prompt it is later evaluated on drafts that answer from
memory: its tau there measures recall, not drafting. Every prompt of the packaged evaluation
sets (``heldout``, on which results are reported, and ``selection``, on which choices are
made) and of the job's own ``eval.prompts`` is therefore kept out of what trains:

* ``dflash-train prompts`` never emits one (``builders/prompts.PromptSet``);
* ``dflash-train regenerate`` skips records that ask one;
* training drops every record that asks one (``data.exclude_eval_prompts``, on by default),
  counted in the data report as ``eval_prompt``, since answer sets built by other tools, or by
  this one before the rule existed, can hold them.

"Asks one" means a user turn (or a plain-text document) that equals or contains an
evaluation prompt after normalization (lowercased words), or, for user turns, paraphrases it
(:func:`is_near`: "Why is photosynthesis important?" against "What is photosynthesis and why
is it important?"). Plain-text documents are matched by containment only: a long document
shares most content words of any short prompt without being about it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import DataError, SkipReport

REASON = "eval_prompt"


def normalize_text(text: str) -> str:
    """Lowercased words separated by single spaces: the key for dedup and evaluation-prompt matching."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


_STOPWORD_TEXT = """
a an the and or but if of to in on at for with from by about as into over under is are was were be been
being am do does did done have has had i me my you your we our it its this that these those what which who
whom whose why how when where can could should would will shall may might must please give tell show
write explain some any few more most very so than then there here also just one two three difference
differences between"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def content_words(text: str) -> frozenset[str]:
    """The normalized words of ``text`` that carry its subject: what a paraphrase keeps."""
    return frozenset(w for w in normalize_text(text).split() if w not in _STOPWORDS)


def is_near(words: frozenset[str], other: frozenset[str], jaccard: float = 0.6) -> bool:
    """Whether two prompts ask about the same thing: their content words mostly agree (Jaccard at
    least ``jaccard``), or all of ``other``'s (three or more) occur in ``words``. Templated prompts
    can land on a paraphrase of a never-trained prompt ("Why is photosynthesis important?" against
    "What is photosynthesis and why is it important?"), whose answer would then be trained on."""
    if not words or not other:
        return False
    shared = len(words & other)
    return shared / len(words | other) >= jaccard or (len(other) >= 3 and shared == len(other))


class EvalPrompts:
    """A set of evaluation prompts to match text against: equal, contained, or near.

    Near matching looks only at the prompts sharing a content word with the text (an index by
    word), so checking a few hundred thousand training records takes seconds."""

    def __init__(self, prompts: Iterable[str] = ()):
        self.prompts = list(dict.fromkeys(p for p in (normalize_text(x) for x in prompts) if p))
        self._words = [content_words(p) for p in self.prompts]
        self._by_word: dict[str, list[int]] = {}
        for i, words in enumerate(self._words):
            for w in words:
                self._by_word.setdefault(w, []).append(i)

    def __len__(self) -> int:
        return len(self.prompts)

    def fingerprint(self) -> str:
        """A digest of the normalized prompts (the tokenized-data cache is keyed by it)."""
        return hashlib.sha256("\n".join(sorted(self.prompts)).encode()).hexdigest()[:16]

    def contained(self, text: str) -> str | None:
        """The evaluation prompt (normalized) that ``text`` equals or contains, if any."""
        padded = f" {normalize_text(text)} "
        return next((p for p in self.prompts if f" {p} " in padded), None)

    def near(self, text: str) -> str | None:
        """The evaluation prompt (normalized) that ``text`` paraphrases (:func:`is_near`), if any."""
        words = content_words(text)
        for i in sorted({i for w in words for i in self._by_word.get(w, ())}):
            if is_near(words, self._words[i]):
                return self.prompts[i]
        return None

    def match(self, text: str) -> str | None:
        """Equal, contained or near: the evaluation prompt ``text`` asks, if any."""
        return self.contained(text) or self.near(text)


def packaged_eval_prompts() -> list[str]:
    """The prompts of every packaged never-trained set (``heldout``, ``selection``)."""
    from .prompt_sets import NEVER_TRAINED, prompt_set_path

    return [p for name in NEVER_TRAINED for p in prompt_lines(prompt_set_path(name))]


def prompt_lines(path: str | Path) -> list[str]:
    """A prompt file's prompts as text: a text file's lines, or each chat record's user turns."""
    from dflash_train.data.prompts import read_prompts

    return [m["content"] for messages in read_prompts(path) for m in messages if m["role"] == "user"]


def evaluation_prompts(extra: Iterable[str | Path] = ()) -> EvalPrompts:
    """The packaged never-trained sets plus ``extra`` (named sets or prompt files: the job's
    ``eval.prompts`` and ``data.exclude_prompts``)."""
    from .prompt_sets import resolve_prompts

    texts = packaged_eval_prompts()
    for source in extra:
        texts += prompt_lines(resolve_prompts(source))
    return EvalPrompts(texts)


def record_match(record, prompts: EvalPrompts) -> tuple[str, str] | None:
    """(field, evaluation prompt) when a ``readers.Record`` asks an evaluation prompt, else None."""
    if record.text is not None:
        hit = prompts.contained(record.text)
        return ("text", hit) if hit else None
    for i, message in enumerate(record.messages):
        if message["role"] == "user" and (hit := prompts.match(message["content"])):
            return f"messages[{i}].content", hit
    return None


def drop_eval_prompts(records: Iterable, prompts: EvalPrompts, report: SkipReport) -> Iterator:
    """``records`` without those that ask an evaluation prompt, each drop counted in ``report``
    (never an error, also with ``data.strict``: such a record is not malformed, only excluded)."""
    for record in records:
        hit = record_match(record, prompts) if len(prompts) else None
        if hit is None:
            yield record
            continue
        field, prompt = hit
        report.skip(DataError(record.location, field, REASON, f"asks the evaluation prompt {prompt[:60]!r}"))
