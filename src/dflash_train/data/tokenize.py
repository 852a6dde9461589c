"""Chat-template tokenization with an exact assistant ``loss_mask``.

Most chat templates have no ``{% generation %}`` markers, so the assistant spans are
derived: the conversation is rendered once with the tokenizer's own template, and each
assistant turn is located after the rendering of the conversation up to that turn with
the generation prompt (falling back to an ordered search when a template renders earlier
turns differently). The span is the assistant content (plus a kept think block) and the
special end-of-turn token that closes it; template scaffolding such as
``<|im_start|>assistant\\n`` or an empty ``<think>\\n\\n</think>`` the template inserts is
never supervised. Each span is decoded back and compared with the message text; a
mismatch is a counted skip, never a silently wrong mask.

Plain-text records (a ``text`` field) need no template: the text is tokenized as the
tokenizer encodes a document (its BOS, if any), closed by EOS, and every token after the
first is supervised. Both kinds are then cut at ``max_length`` (counted: the caller reports
how many examples and supervised tokens the cut removed) and filtered alike.

Rendering the template several times per conversation makes tokenization CPU-bound
(66 s for 32K conversations on one core), so ``tokenize_records`` can spread chunks
of records over worker processes; results come back in input order and skips are
counted by the caller, so the output and the report are those of the serial loop.
"""

from __future__ import annotations

import itertools
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .chat_template import missing_template_message
from .errors import DataError, SkipReport, handle
from .lookup import lookup_tau
from .loops import trim_looping_tails
from .readers import Record

THINK_RE = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass
class TokenizeOptions:
    max_length: int = 2048
    supervise: str = "all"  # or "last"
    keep_reasoning: bool = True
    min_supervised_tokens: int = 32
    trim_loops: bool = False  # data/loops.py: cut answers that end in a repetition loop
    max_lookup_tau: float | None = None  # data/lookup.py: skip answers that are mostly copies

    def key(self) -> dict:
        key = {"max_length": self.max_length, "supervise": self.supervise,
               "keep_reasoning": self.keep_reasoning, "min_supervised_tokens": self.min_supervised_tokens}
        if self.trim_loops:  # only when on: caches built before the option existed stay valid
            key["trim_loops"] = True
        if self.max_lookup_tau is not None:
            key["max_lookup_tau"] = self.max_lookup_tau
        return key


def check_chat_template(tokenizer) -> None:
    """A tokenizer without a chat template cannot define turns: a clear error (chat records only)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(missing_template_message(tokenizer))
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("a fast tokenizer (tokenizer.json) is needed for character offsets")


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def prepare_messages(messages: list[dict], keep_reasoning: bool, template: str) -> list[dict]:
    """Apply the reasoning option: drop think content, or hand it to templates that render it."""
    supports_reasoning = "reasoning_content" in template
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "assistant":
            if not keep_reasoning:
                m.pop("reasoning_content", None)
                m["content"] = THINK_RE.sub("", m["content"])
            elif supports_reasoning and "reasoning_content" not in m and "</think>" in m["content"]:
                head, _, tail = m["content"].partition("</think>")
                m["reasoning_content"] = head.split("<think>")[-1].strip("\n")
                m["content"] = tail.lstrip("\n")
        out.append(m)
    return out


def special_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
    return ids


@dataclass
class Span:
    message: int
    start: int  # character offsets in the rendered text
    end: int
    reasoning: bool


def assistant_spans(tokenizer, messages: list[dict], text: str, supervise: str, location: str) -> list[Span]:
    """Character spans of the supervised assistant content, in order."""
    targets = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m["content"].strip()]
    if supervise == "last":
        targets = targets[-1:]
    spans, cursor = [], 0
    for i in targets:
        start = _turn_start(tokenizer, messages, i, text, cursor)
        content = messages[i]["content"].strip()
        cstart = text.find(content, start)
        if cstart < 0:
            raise DataError(location, f"messages[{i}].content", "template_mismatch",
                            "assistant content not found in the rendered chat template")
        sup_start, has_reasoning = cstart, False
        reasoning = (messages[i].get("reasoning_content") or "").strip()
        rpos = text.rfind(reasoning, start, cstart) if reasoning else -1
        if rpos >= 0:
            opener = text.rfind("<think>", start, rpos)
            sup_start, has_reasoning = (opener if opener >= 0 else rpos), True
        spans.append(Span(i, sup_start, cstart + len(content), has_reasoning))
        cursor = cstart + len(content)
    return spans


def _turn_start(tokenizer, messages: list[dict], i: int, text: str, cursor: int) -> int:
    """Where turn ``i``'s generated text begins: right after the rendered prompt when it is a prefix."""
    if i == 0:
        return cursor
    try:
        prefix = render(tokenizer, messages[:i], add_generation_prompt=True)
    except Exception:  # some templates reject partial conversations; fall back to the ordered search
        return cursor
    return max(len(prefix), cursor) if text.startswith(prefix) else cursor


def tokenize_messages(tokenizer, messages: list[dict], opts: TokenizeOptions, location: str,
                      specials: set[int] | None = None) -> tuple[list[int], list[int]]:
    """Return ``(input_ids, loss_mask)`` of one conversation, or raise ``DataError``."""
    ids, mask, *_ = tokenize_conversation(tokenizer, messages, opts, location, specials)
    return ids, mask


@dataclass
class Cut:
    """What happened to one kept example on its way to a row."""

    trimmed: tuple[int, int] = (0, 0)  # looping tails trimmed, supervised tokens they held
    truncated: bool = False  # longer than max_length, cut to it
    truncated_supervised: int = 0  # supervised tokens that cut removed


def tokenize_text(tokenizer, text: str, opts: TokenizeOptions, location: str,
                  specials: set[int] | None = None) -> tuple[list[int], list[int], Cut]:
    """``(input_ids, loss_mask, cut)`` of one plain-text record: the document as the tokenizer
    encodes it (with its BOS, if any), then EOS, every token after the first supervised."""
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)  # packed documents end where the model would stop
    mask = [0] + [1] * (len(ids) - 1)
    specials = special_ids(tokenizer) if specials is None else specials
    return _finish(ids, mask, [list(range(1, len(ids)))], specials, opts, location, "text")


def _finish(ids: list[int], mask: list[int], segments: list[list[int]], specials: set[int],
            opts: TokenizeOptions, location: str, field: str) -> tuple[list[int], list[int], Cut]:
    """Cut at max_length (counted), trim looping tails, then the filters that skip a record."""
    cut = Cut(truncated=len(ids) > opts.max_length, truncated_supervised=sum(mask[opts.max_length:]))
    ids, mask = ids[: opts.max_length], mask[: opts.max_length]
    if opts.trim_loops:
        ids, mask, *trimmed = trim_looping_tails(ids, mask, segments, specials)
        cut.trimmed = tuple(trimmed)
    n = sum(mask)
    if n < opts.min_supervised_tokens:
        raise DataError(location, field, "too_few_supervised",
                        f"{n} supervised tokens < min_supervised_tokens={opts.min_supervised_tokens}")
    if opts.max_lookup_tau is not None and (copied := lookup_tau(ids, mask)) > opts.max_lookup_tau:
        raise DataError(location, field, "mostly_copied",
                        f"prompt lookup drafts {copied:.2f} tokens per step of the answer > "
                        f"max_lookup_tau={opts.max_lookup_tau:g}")
    return ids, mask, cut


def tokenize_conversation(tokenizer, messages: list[dict], opts: TokenizeOptions, location: str,
                          specials: set[int] | None = None) -> tuple[list[int], list[int], Cut]:
    """``(input_ids, loss_mask, cut)`` of one conversation, or raise ``DataError``."""
    messages = prepare_messages(messages, opts.keep_reasoning, tokenizer.chat_template)
    try:
        text = render(tokenizer, messages)
    except Exception as err:  # e.g. raise_exception('roles must alternate') inside the template
        raise DataError(location, "messages", "template_error", str(err)) from err
    spans = assistant_spans(tokenizer, messages, text, opts.supervise, location)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    specials = special_ids(tokenizer) if specials is None else specials
    mask, segments = [0] * len(ids), []
    for span in spans:
        picked = _mark_span(ids, offsets, span, specials, tokenizer, mask)
        _verify(tokenizer, [ids[t] for t in picked], messages[span.message], span, specials, location)
        segments.append(picked)
    return _finish(ids, mask, segments, specials, opts, location, "messages")


def _mark_span(ids, offsets, span: Span, specials: set[int], tokenizer, mask: list[int]) -> list[int]:
    """Set mask on tokens overlapping the span, then on the end-of-turn special token after it."""
    picked = [t for t, (s, e) in enumerate(offsets) if e > s and s < span.end and e > span.start]
    if not picked:
        return picked
    tail, t = [], picked[-1] + 1
    while t < len(ids) and ids[t] not in specials and not tokenizer.decode([ids[t]]).strip():
        tail.append(t)  # whitespace the template kept between content and end-of-turn
        t += 1
    if t < len(ids) and ids[t] in specials:
        picked += tail + [t]
    for t in picked:
        mask[t] = 1
    return picked


def _verify(tokenizer, span_ids: list[int], message: dict, span: Span, specials, location: str) -> None:
    """Decode the supervised tokens and compare with the assistant text the user supplied."""
    if span_ids and span_ids[-1] in specials:
        span_ids = span_ids[:-1]
    decoded = tokenizer.decode(span_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False).strip()
    content = message["content"].strip()
    if span.reasoning:
        ok = decoded.endswith(content) and message.get("reasoning_content", "").strip() in decoded
    else:
        ok = decoded == content
    if not ok:
        raise DataError(location, f"messages[{span.message}].content", "template_mismatch",
                        f"supervised tokens decode to {decoded[:60]!r}, expected {content[:60]!r}")


def default_num_workers() -> int:
    """min(8, usable CPU cores): tokenization scales with cores; more rarely pays."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores))


def tokenize_records(records: Iterable[Record], tokenizer, opts: TokenizeOptions, report: SkipReport,
                     strict: bool = False, num_workers: int = 1) -> Iterator[dict]:
    """Yield dataset rows in input order; records that fail are counted in ``report`` (or
    raise if strict). ``num_workers > 1`` tokenizes in that many processes."""
    results = _serial if num_workers <= 1 else _parallel
    for result in results(records, tokenizer, opts, num_workers):
        if isinstance(result, tuple):  # a failed record: (location, field, reason, message)
            err = DataError(*result[:3])
            err.args = (result[3],)
            handle(err, report, strict)
            continue
        report.kept += 1
        cut = result.pop("cut")
        if opts.trim_loops:
            report.count_trimmed(*cut.trimmed, result["num_supervised"])
        report.count_kept(cut.truncated, cut.truncated_supervised, result["num_supervised"])
        yield result


def _tokenize_one(tokenizer, rec: Record, opts: TokenizeOptions, specials: set[int]) -> dict | tuple:
    """A dataset row, or the record's failure as a picklable tuple. Chat records and a tokenizer
    without a chat template: a ``ValueError`` for the whole run (no record could be used)."""
    try:
        if rec.text is not None:
            ids, mask, cut = tokenize_text(tokenizer, rec.text, opts, rec.location, specials)
        else:
            check_chat_template(tokenizer)
            ids, mask, cut = tokenize_conversation(tokenizer, rec.messages, opts, rec.location, specials)
    except DataError as err:
        return err.location, err.field, err.reason, str(err)
    return {"input_ids": ids, "loss_mask": mask, "length": len(ids), "num_supervised": sum(mask), "cut": cut}


def _serial(records: Iterable[Record], tokenizer, opts: TokenizeOptions, _workers: int = 1):
    specials = special_ids(tokenizer)
    for rec in records:
        yield _tokenize_one(tokenizer, rec, opts, specials)


_CHUNK = 64  # records per task: large enough to amortize pickling, small enough to balance
_WORKER: dict = {}


def _init_worker(tokenizer, opts: TokenizeOptions) -> None:
    _WORKER.update(tokenizer=tokenizer, opts=opts, specials=special_ids(tokenizer))


def _work(chunk: list[Record]) -> list[dict | tuple]:
    w = _WORKER
    return [_tokenize_one(w["tokenizer"], rec, w["opts"], w["specials"]) for rec in chunk]


def _parallel(records: Iterable[Record], tokenizer, opts: TokenizeOptions, workers: int):
    """Chunks through a process pool, a bounded number in flight, yielded in input order.

    Workers are forked where the platform can (as ``datasets.map(num_proc=...)`` does):
    they inherit the tokenizer, start in milliseconds, and, unlike spawned ones, never
    re-run the caller's script, which would fail in any script that builds data at
    module level. They only run Python and the tokenizer, never torch or CUDA.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    chunks = _chunks(iter(records), _CHUNK)
    head = list(itertools.islice(chunks, 2))
    if len(head) < 2:  # one chunk at most: starting processes would cost more than it saves
        yield from _serial([rec for chunk in head for rec in chunk], tokenizer, opts)
        return
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(tokenizer, opts)) as pool:
        pending = deque()
        for chunk in itertools.chain(head, chunks):
            pending.append(pool.submit(_work, chunk))
            if len(pending) >= 4 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


def _chunks(it: Iterator, size: int) -> Iterator[list]:
    while chunk := list(itertools.islice(it, size)):
        yield chunk
