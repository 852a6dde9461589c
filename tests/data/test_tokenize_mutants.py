"""Tokenization pinned by the mutants it kills (issue 60.4; docs/results/mutation/tokenize-triage.md).

mutmut over ``data/tokenize.py`` left mutants alive that change which tokens are trained on
without any test noticing: where an assistant span starts and ends (the search cursor, the
reasoning and ``<think>`` searches, the turn's start after the generation prompt), the
whitespace and end-of-turn token ``_mark_span`` adds, the ``_verify`` check that refuses a
wrong mask, plain-text EOS handling, the bounds of the ``_finish`` filters and the cache key
(a key that drops or renames an option reuses, or never reuses, a tokenization). Each test
checks against a reference built by hand: character spans of a text written out, the decoded
supervised runs of the real SmolLM2 (ChatML) tokenizer, exact ids, exact key dicts.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dflash_train.data.errors import DataError, SkipReport
from dflash_train.data.lookup import lookup_tau
from dflash_train.data.readers import Record
from dflash_train.data.tokenize import (
    Span,
    TokenizeOptions,
    _mark_span,
    _verify,
    assistant_spans,
    check_chat_template,
    prepare_messages,
    render,
    special_ids,
    tokenize_conversation,
    tokenize_records,
    tokenize_text,
)


def runs(tok, ids, mask) -> list[str]:
    """Decode each maximal run of supervised tokens."""
    out, run = [], []
    for i, m in zip(list(ids) + [None], list(mask) + [0]):
        if m:
            run.append(i)
        elif run:
            out.append(tok.decode(run, skip_special_tokens=False))
            run = []
    return out


class NoRender:
    """A tokenizer whose template rejects partial conversations: ``_turn_start`` falls back to the cursor."""

    def apply_chat_template(self, *args, **kwargs):
        raise ValueError("no partial conversations")


class OtherRender:
    """A template whose partial rendering is not a prefix of the full text: ignored."""

    def apply_chat_template(self, *args, **kwargs):
        return "ZZZZZZZZZZZZ"


A = "assistant"


# --- TokenizeOptions.key: the cache key -------------------------------------------------------

def test_key_is_exact_and_changes_with_every_option():
    base = {"max_length": 2048, "supervise": "all", "keep_reasoning": True, "min_supervised_tokens": 32}
    assert TokenizeOptions().key() == base  # names kept: caches built by earlier versions stay valid
    assert TokenizeOptions(trim_loops=True).key() == {**base, "trim_loops": True}
    assert TokenizeOptions(max_lookup_tau=1.5).key() == {**base, "max_lookup_tau": 1.5}
    changed = [TokenizeOptions(max_length=512), TokenizeOptions(supervise="last"),
               TokenizeOptions(keep_reasoning=False), TokenizeOptions(min_supervised_tokens=1),
               TokenizeOptions(trim_loops=True), TokenizeOptions(max_lookup_tau=1.5),
               TokenizeOptions(max_lookup_tau=2.0)]
    keys = [repr(sorted(o.key().items())) for o in [TokenizeOptions(), *changed]]
    assert len(set(keys)) == len(keys)


# --- check_chat_template ----------------------------------------------------------------------

def test_check_chat_template_on_objects_without_the_attributes():
    with pytest.raises(ValueError, match="'my/tok' has no chat template"):
        check_chat_template(SimpleNamespace(name_or_path="my/tok"))  # no chat_template attribute
    with pytest.raises(ValueError, match=r"^a fast tokenizer \(tokenizer.json\) is needed for character offsets$"):
        check_chat_template(SimpleNamespace(chat_template="{{ x }}"))  # no is_fast attribute
    check_chat_template(SimpleNamespace(chat_template="{{ x }}", is_fast=True))


# --- prepare_messages -------------------------------------------------------------------------

REASONING_TEMPLATE = "{{ message.reasoning_content }}"


def test_prepare_messages_splits_think_only_for_templates_that_render_reasoning():
    msgs = [{"role": "user", "content": "<think>u</think>q"},
            {"role": "assistant", "content": "<think>\n  why \n</think>\n\nAnswer </think> tail"}]
    out = prepare_messages(msgs, True, REASONING_TEMPLATE)
    assert out[0] == msgs[0]
    # partition at the first </think>; only newlines stripped from the reasoning
    assert out[1] == {"role": "assistant", "reasoning_content": "  why ", "content": "Answer </think> tail"}
    assert msgs[1]["content"].startswith("<think>")  # the caller's dicts are not changed
    assert prepare_messages(msgs, True, "{{ message.content }}") == msgs


def test_prepare_messages_keeps_given_reasoning_content():
    msgs = [{"role": "assistant", "content": "<think>a</think>b", "reasoning_content": "given"}]
    assert prepare_messages(msgs, True, REASONING_TEMPLATE) == msgs


def test_prepare_messages_drops_reasoning():
    msgs = [{"role": "assistant", "content": "<think>x</think>\n Answer"}]  # no reasoning_content key
    assert prepare_messages(msgs, False, REASONING_TEMPLATE) == [{"role": "assistant", "content": "Answer"}]
    both = [{"role": "assistant", "content": "B", "reasoning_content": "R"}]
    assert prepare_messages(both, False, REASONING_TEMPLATE) == [{"role": "assistant", "content": "B"}]


# --- assistant_spans on texts written out by hand ---------------------------------------------

def test_span_at_offset_zero():
    assert assistant_spans(NoRender(), [{"role": A, "content": "Hello"}], "Hello<e>", "all", "f:1") == [
        Span(0, 0, 5, False)]


def test_span_not_found_names_the_turn():
    with pytest.raises(DataError) as err:
        assistant_spans(NoRender(), [{"role": A, "content": "Hello"}], "Bye", "all", "f:7")
    assert (err.value.location, err.value.field, err.value.reason) == ("f:7", "messages[0].content",
                                                                       "template_mismatch")
    assert str(err.value).endswith(": assistant content not found in the rendered chat template")


def test_no_reasoning_supervises_from_the_content():
    msgs = [{"role": A, "content": "B"}]
    assert assistant_spans(NoRender(), msgs, "XXXX B", "all", "f") == [Span(0, 5, 6, False)]


def test_reasoning_at_offset_zero_and_without_opener():
    msgs = [{"role": A, "content": "A", "reasoning_content": "R"}]
    assert assistant_spans(NoRender(), msgs, "R\nA", "all", "f") == [Span(0, 0, 3, True)]
    assert assistant_spans(NoRender(), msgs, "x R\nA", "all", "f") == [Span(0, 2, 5, True)]


def test_reasoning_opener_at_offset_zero_and_the_last_ones_are_used():
    msgs = [{"role": A, "content": "A", "reasoning_content": "R"}]
    assert assistant_spans(NoRender(), msgs, "<think>R</think>A", "all", "f") == [Span(0, 0, 17, True)]
    # the last reasoning before the content, and the last <think> before it
    assert assistant_spans(NoRender(), msgs, "R <think>R</think>A", "all", "f") == [Span(0, 2, 19, True)]
    assert assistant_spans(NoRender(), msgs, "<think> <think>R</think>A", "all", "f") == [Span(0, 8, 25, True)]


def test_reasoning_searched_only_between_turn_start_and_content():
    two = [{"role": A, "content": "R"}, {"role": A, "content": "A", "reasoning_content": "R"}]
    # the earlier "R" (turn 0) is not turn 1's reasoning
    assert assistant_spans(NoRender(), two, "R|A", "all", "f") == [Span(0, 0, 1, False), Span(1, 2, 3, False)]
    # a later "R" or "<think>" (after the content) is not either
    one = [{"role": A, "content": "A <think> B", "reasoning_content": "R"}]
    assert assistant_spans(NoRender(), one, "R\nA <think> B", "all", "f") == [Span(0, 0, 13, True)]
    after = [{"role": A, "content": "A", "reasoning_content": "R"}]
    assert assistant_spans(NoRender(), after, "A R", "all", "f") == [Span(0, 0, 1, False)]
    # an earlier turn's <think> does not open this turn's reasoning
    opener = [{"role": A, "content": "Q"}, {"role": A, "content": "A", "reasoning_content": "R"}]
    assert assistant_spans(NoRender(), opener, "<think>Q|R A", "all", "f") == [
        Span(0, 7, 8, False), Span(1, 9, 12, True)]


def test_repeated_answers_map_to_successive_occurrences():
    msgs = [{"role": A, "content": "OK"}, {"role": A, "content": "OK"}]
    assert assistant_spans(NoRender(), msgs, "abcdefOK|OK", "all", "f") == [
        Span(0, 6, 8, False), Span(1, 9, 11, False)]


def test_partial_rendering_that_is_not_a_prefix_is_ignored():
    msgs = [{"role": "user", "content": "Q"}, {"role": A, "content": "A"}]
    assert assistant_spans(OtherRender(), msgs, "Q|A", "all", "f") == [Span(1, 2, 3, False)]


def test_content_equal_to_the_role_name_is_found_after_the_generation_prompt(chatml_tok):
    msgs = [{"role": "user", "content": "hi"}, {"role": A, "content": "assistant"}]
    ids, mask, _ = tokenize_conversation(chatml_tok, msgs, TokenizeOptions(min_supervised_tokens=1), "f")
    assert runs(chatml_tok, ids, mask) == ["assistant<|im_end|>"]
    text = chatml_tok.decode(ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\nassistant<|im_end|>\n")
    assert mask[-3:] == [1, 1, 0]  # content, <|im_end|>, "\n"


# --- _mark_span with the real tokenizer -------------------------------------------------------

def _enc(tok, text):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]


def test_mark_span_adds_trailing_whitespace_and_end_of_turn(chatml_tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": A, "content": "It is 4.\n\n"}]
    ids, mask, _ = tokenize_conversation(chatml_tok, msgs, TokenizeOptions(min_supervised_tokens=1), "f")
    assert runs(chatml_tok, ids, mask) == ["It is 4.\n\n<|im_end|>"]


def test_mark_span_at_the_end_of_the_text(chatml_tok):
    text = "<|im_start|>assistant\nHello world"
    ids, offsets = _enc(chatml_tok, text)
    mask = [0] * len(ids)
    picked = _mark_span(ids, offsets, Span(0, text.index("Hello"), len(text), False),
                        special_ids(chatml_tok), chatml_tok, mask)
    assert chatml_tok.decode([ids[t] for t in picked]) == "Hello world"
    assert mask == [0] * (len(ids) - len(picked)) + [1] * len(picked)


def test_mark_span_does_not_take_plain_text_after_the_content(chatml_tok):
    text = "Hello world END<|im_end|>"
    ids, offsets = _enc(chatml_tok, text)
    mask = [0] * len(ids)
    picked = _mark_span(ids, offsets, Span(0, 0, 11, False), special_ids(chatml_tok), chatml_tok, mask)
    assert chatml_tok.decode([ids[t] for t in picked]) == "Hello world"


def test_mark_span_skips_zero_width_tokens(chatml_tok):
    ids, offsets = [10, 11, 12], [(0, 2), (2, 2), (2, 4)]
    mask = [0, 0, 0]
    assert _mark_span(ids, offsets, Span(0, 0, 4, False), set(), chatml_tok, mask) == [0, 2]
    assert mask == [1, 0, 1]


# --- _verify ----------------------------------------------------------------------------------

def test_verify_keeps_the_last_token_when_it_is_not_special(chatml_tok):
    ids = chatml_tok.encode("Hello world", add_special_tokens=False)
    _verify(chatml_tok, ids, {"content": "Hello world"}, Span(0, 0, 11, False), special_ids(chatml_tok), "f")
    with pytest.raises(DataError):
        _verify(chatml_tok, [], {"content": "Hello"}, Span(0, 0, 5, False), special_ids(chatml_tok), "f")


def test_verify_decodes_specials_and_spaces_as_they_are(chatml_tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": A, "content": "a<|endoftext|>b , c ."}]
    ids, mask, _ = tokenize_conversation(chatml_tok, msgs, TokenizeOptions(min_supervised_tokens=1), "f")
    assert runs(chatml_tok, ids, mask) == ["a<|endoftext|>b , c .<|im_end|>"]


def test_verify_with_reasoning_needs_both(chatml_tok):
    sp = special_ids(chatml_tok)
    ids = chatml_tok.encode("<think>R</think>A", add_special_tokens=False)
    _verify(chatml_tok, ids, {"content": "A", "reasoning_content": "R"}, Span(0, 0, 1, True), sp, "f")
    with pytest.raises(DataError):  # the content does not match
        _verify(chatml_tok, ids, {"content": "B", "reasoning_content": "R"}, Span(0, 0, 1, True), sp, "f")
    with pytest.raises(DataError):  # the reasoning is not there
        _verify(chatml_tok, ids, {"content": "A", "reasoning_content": "Q"}, Span(0, 0, 1, True), sp, "f")


def test_verify_error_names_the_turn_and_both_texts(chatml_tok):
    content, other = "c" * 70, "d" * 70
    ids = chatml_tok.encode(other, add_special_tokens=False)
    with pytest.raises(DataError) as err:
        _verify(chatml_tok, ids, {"content": content}, Span(3, 0, 1, False), special_ids(chatml_tok), "f:9")
    e = err.value
    assert (e.location, e.field, e.reason) == ("f:9", "messages[3].content", "template_mismatch")
    assert str(e) == (f"f:9: field 'messages[3].content': template_mismatch: supervised tokens decode to "
                      f"{other[:60]!r}, expected {content[:60]!r}")


# --- tokenize_text ----------------------------------------------------------------------------

class DocTokenizer:
    """A tokenizer that adds a BOS only when asked, with a chosen (or no) EOS."""

    def __init__(self, eos):
        self.eos_token_id = eos
        self.all_special_ids = [1] + ([eos] if eos is not None else [])
        self.added_tokens_decoder = {}

    def __call__(self, text, add_special_tokens=False):
        body = [100 + ord(c) for c in text]
        return {"input_ids": ([1] if add_special_tokens else []) + body}


def test_text_keeps_bos_and_appends_eos_once(chatml_tok):
    opts = TokenizeOptions(min_supervised_tokens=1)
    ids, mask, _ = tokenize_text(DocTokenizer(2), "abc", opts, "f")
    assert ids == [1, 197, 198, 199, 2] and mask == [0, 1, 1, 1, 1]
    ids, _, _ = tokenize_text(DocTokenizer(None), "abc", opts, "f")
    assert ids == [1, 197, 198, 199]
    eos = chatml_tok.eos_token
    ids, mask, _ = tokenize_text(chatml_tok, f"one two three{eos}", opts, "f")
    assert ids == chatml_tok(f"one two three{eos}")["input_ids"] and ids[-1] == chatml_tok.eos_token_id
    assert ids.count(chatml_tok.eos_token_id) == 1
    assert mask == [0] + [1] * (len(ids) - 1)


@pytest.mark.parametrize("specials", [None, "given"])
def test_text_trims_a_pure_loop(chatml_tok, specials):
    text = "the cat sat on the mat. " * 30
    sp = special_ids(chatml_tok) if specials else None
    ids, mask, cut = tokenize_text(chatml_tok, text, TokenizeOptions(min_supervised_tokens=1, trim_loops=True),
                                   "f", sp)
    full = chatml_tok(text)["input_ids"] + [chatml_tok.eos_token_id]
    assert cut.trimmed == (1, 197) and len(ids) == 15 and ids == full[:15]
    assert mask == [0] + [1] * 14


def test_text_errors_name_location_and_field(chatml_tok):
    with pytest.raises(DataError) as err:
        tokenize_text(chatml_tok, "hi", TokenizeOptions(min_supervised_tokens=50), "f:3")
    assert (err.value.location, err.value.field, err.value.reason) == ("f:3", "text", "too_few_supervised")
    assert str(err.value).endswith(": 1 supervised tokens < min_supervised_tokens=50")


# --- _finish bounds ---------------------------------------------------------------------------

def test_finish_bounds_are_inclusive(chatml_tok):
    text = "one two three four five"
    n = len(chatml_tok(text)["input_ids"]) + 1  # with EOS
    _, mask, cut = tokenize_text(chatml_tok, text, TokenizeOptions(max_length=n, min_supervised_tokens=n - 1), "f")
    assert not cut.truncated and cut.truncated_supervised == 0 and sum(mask) == n - 1
    _, _, cut = tokenize_text(chatml_tok, text, TokenizeOptions(max_length=n - 1, min_supervised_tokens=1), "f")
    assert cut.truncated and cut.truncated_supervised == 1


def test_finish_lookup_tau_bound_and_error(chatml_tok):
    text = "alpha beta gamma delta " * 4
    ids, mask, _ = tokenize_text(chatml_tok, text, TokenizeOptions(min_supervised_tokens=1), "f")
    tau = lookup_tau(ids, mask)
    assert tau > 1
    tokenize_text(chatml_tok, text, TokenizeOptions(min_supervised_tokens=1, max_lookup_tau=tau), "f")
    with pytest.raises(DataError) as err:
        tokenize_text(chatml_tok, text, TokenizeOptions(min_supervised_tokens=1, max_lookup_tau=1.0), "f:4")
    assert (err.value.location, err.value.field, err.value.reason) == ("f:4", "text", "mostly_copied")
    assert str(err.value).endswith(f": prompt lookup drafts {tau:.2f} tokens per step of the answer > "
                                   "max_lookup_tau=1")


# --- prepare_messages edges and tokenize_conversation's errors (the second re-run) ------------

def test_prepare_messages_reasoning_without_opener_and_edge_characters():
    msgs = [{"role": A, "content": "R1</think>A"},  # a template that prefilled <think>
            {"role": A, "content": "<think>a<think>\nXbX\n</think>\n  XA"},
            {"role": A, "content": "<think>r</think>\nXA"}]
    out = prepare_messages(msgs, True, REASONING_TEMPLATE)
    assert [(m["reasoning_content"], m["content"]) for m in out] == [("R1", "A"), ("XbX", "  XA"), ("r", "XA")]


class Wrapped:
    """The real tokenizer, with a chosen chat template and a BOS added unless told not to."""

    def __init__(self, tok, template=None, bos=None):
        self._tok, self._bos = tok, bos
        self.chat_template = template or tok.chat_template

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def apply_chat_template(self, messages, **kw):
        return self._tok.apply_chat_template(messages, chat_template=self.chat_template, **kw)

    def __call__(self, text, add_special_tokens=True, **kw):
        enc = self._tok(text, add_special_tokens=False, **kw)
        if add_special_tokens and self._bos is not None:
            enc = {"input_ids": [self._bos] + enc["input_ids"], "offset_mapping": [(0, 0)] + enc["offset_mapping"]}
        return enc


def test_conversation_is_encoded_without_added_specials(chatml_tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": A, "content": "Hello there"}]
    opts = TokenizeOptions(min_supervised_tokens=1)
    ids, mask, _ = tokenize_conversation(chatml_tok, msgs, opts, "f")
    assert tokenize_conversation(Wrapped(chatml_tok, bos=chatml_tok.bos_token_id), msgs, opts, "f")[:2] == (ids, mask)


def test_conversation_errors_name_location_and_field(chatml_tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": A, "content": "ello"}]
    opts = TokenizeOptions(min_supervised_tokens=1)
    cases = [("{{ raise_exception('roles must alternate') }}", "messages", "template_error"),
             ("{% for m in messages %}{{ m.role }}<|im_end|>{% endfor %}", "messages[1].content", "template_mismatch"),
             # "H" + "ello" is one token "Hello": the supervised tokens decode to more than the answer
             ("{% for m in messages %}H{{ m.content }}<|im_end|>{% endfor %}", "messages[1].content",
              "template_mismatch")]
    for template, field, reason in cases:
        with pytest.raises(DataError) as err:
            tokenize_conversation(Wrapped(chatml_tok, template), msgs, opts, "f:5")
        assert (err.value.location, err.value.field, err.value.reason) == ("f:5", field, reason), template


# --- render: what the chat template is asked for --------------------------------------------------

class Recorder:
    """A tokenizer that records what ``apply_chat_template`` was asked."""

    def apply_chat_template(self, messages, **kwargs):
        self.messages, self.kwargs = messages, kwargs
        return "rendered"


def test_render_asks_for_text_the_generation_prompt_and_the_templates_options():
    tok, messages = Recorder(), [{"role": "user", "content": "hi"}]
    assert render(tok, messages, add_generation_prompt=True, enable_thinking=False) == "rendered"
    assert tok.messages is messages
    assert tok.kwargs == {"tokenize": False, "add_generation_prompt": True, "enable_thinking": False}
    render(tok, messages)
    assert tok.kwargs == {"tokenize": False, "add_generation_prompt": False}


def test_records_that_fail_are_counted_by_default(chatml_tok):
    """``strict`` is off unless asked for: a record with too few supervised tokens is a counted
    skip with its location, and the good record after it is still a row."""
    records = [Record("a", "d.jsonl:1", [], text="hi"),
               Record("b", "d.jsonl:2", [], text="one two three four five six seven eight nine ten")]
    report = SkipReport()
    rows = list(tokenize_records(records, chatml_tok, TokenizeOptions(min_supervised_tokens=4), report))
    assert [r["length"] for r in rows] == [len(chatml_tok("one two three four five six seven eight nine ten")
                                               ["input_ids"]) + 1]
    assert report.kept == 1 and dict(report.skipped) == {"too_few_supervised": 1}
    assert report.examples["too_few_supervised"] == ["d.jsonl:1 (text)"]
