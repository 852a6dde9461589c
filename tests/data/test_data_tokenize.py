"""Loss masks are exact: decoded supervised spans equal assistant text + end-of-turn token."""

from __future__ import annotations

import pytest

from dflash_train.data.errors import DataError
from dflash_train.data.tokenize import TokenizeOptions, check_chat_template, tokenize_messages

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4."},
]


def spans(tok, ids, mask) -> list[str]:
    """Decode each maximal run of supervised tokens."""
    out, run = [], []
    for i, m in zip(ids + [None], mask + [0]):
        if m:
            run.append(i)
        elif run:
            out.append(tok.decode(run, skip_special_tokens=False))
            run = []
    return out


def opts(**kw) -> TokenizeOptions:
    return TokenizeOptions(**{"min_supervised_tokens": 1, **kw})


@pytest.mark.parametrize("supervise", ["all", "last"])
def test_chatml_multi_turn(chatml_tok, supervise):
    ids, mask = tokenize_messages(chatml_tok, CONV, opts(supervise=supervise), "t:1")
    expected = ["Hello! How can I help?<|im_end|>", "It is 4.<|im_end|>"]
    assert spans(chatml_tok, ids, mask) == (expected if supervise == "all" else expected[-1:])
    header = chatml_tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    starts = [i for i in range(len(ids)) if ids[i:i + len(header)] == header]
    assert len(starts) == 2 and all(mask[s + k] == 0 for s in starts for k in range(len(header)))


def test_chatml_default_system_prompt_not_supervised(chatml_tok):
    conv = [{"role": "user", "content": "Name?"}, {"role": "assistant", "content": "SmolLM"}]
    ids, mask = tokenize_messages(chatml_tok, conv, opts(), "t:1")
    assert spans(chatml_tok, ids, mask) == ["SmolLM<|im_end|>"]  # not the "SmolLM" of the system prompt


@pytest.mark.parametrize("supervise", ["all", "last"])
def test_llama3_multi_turn(llama3_tok, supervise):
    conv = [dict(m) for m in CONV]
    conv[4]["content"] = "  It is 4.\n"  # Llama-3 trims content
    ids, mask = tokenize_messages(llama3_tok, conv, opts(supervise=supervise), "t:1")
    assert ids[0] == llama3_tok.convert_tokens_to_ids("<|begin_of_text|>")
    expected = ["Hello! How can I help?<|eot_id|>", "It is 4.<|eot_id|>"]
    assert spans(llama3_tok, ids, mask) == (expected if supervise == "all" else expected[-1:])


def _qwen_conv(reasoning_last: str | None):
    conv = [dict(m) for m in CONV]
    conv[2]["reasoning_content"] = "old thoughts"  # before the last query: the template drops it
    if reasoning_last is not None:
        conv[4]["reasoning_content"] = reasoning_last
    return conv


def test_qwen3_keep_reasoning(qwen3_tok):
    ids, mask = tokenize_messages(qwen3_tok, _qwen_conv("add two and two"), opts(), "t:1")
    assert spans(qwen3_tok, ids, mask) == [
        "Hello! How can I help?<|im_end|>", "<think>\nadd two and two\n</think>\n\nIt is 4.<|im_end|>"]


def test_qwen3_drop_reasoning_never_supervises_inserted_block(qwen3_tok):
    ids, mask = tokenize_messages(qwen3_tok, _qwen_conv("add two and two"), opts(keep_reasoning=False), "t:1")
    text = qwen3_tok.decode(ids, skip_special_tokens=False)
    assert "<think>\n\n</think>\n\nIt is 4." in text and "add two" not in text
    assert spans(qwen3_tok, ids, mask) == ["Hello! How can I help?<|im_end|>", "It is 4.<|im_end|>"]
    think = {qwen3_tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>")}
    assert all(m == 0 for i, m in zip(ids, mask) if i in think)


def test_qwen3_inline_think_and_empty_reasoning(qwen3_tok):
    conv = _qwen_conv(None)
    conv[4]["content"] = "<think>\nsum\n</think>\n\nIt is 4."
    ids, mask = tokenize_messages(qwen3_tok, conv, opts(supervise="last"), "t:1")
    assert spans(qwen3_tok, ids, mask) == ["<think>\nsum\n</think>\n\nIt is 4.<|im_end|>"]
    ids, mask = tokenize_messages(qwen3_tok, _qwen_conv(""), opts(supervise="last"), "t:1")
    assert spans(qwen3_tok, ids, mask) == ["It is 4.<|im_end|>"]  # empty think block: 0


def test_truncation_and_min_supervised(chatml_tok):
    ids, mask = tokenize_messages(chatml_tok, CONV, opts(max_length=40), "t:1")
    assert len(ids) == len(mask) == 40
    with pytest.raises(DataError) as err:
        tokenize_messages(chatml_tok, CONV, opts(min_supervised_tokens=1000), "f.jsonl:3")
    assert err.value.reason == "too_few_supervised" and "f.jsonl:3" in str(err.value)


def test_template_mismatch_is_detected(chatml_tok):
    tok = chatml_tok.__class__.from_pretrained(chatml_tok.name_or_path)
    tok.chat_template = chatml_tok.chat_template.replace("message['content']", "message['content'] | upper")
    with pytest.raises(DataError) as err:
        tokenize_messages(tok, CONV, opts(), "f.jsonl:7")
    assert err.value.reason == "template_mismatch" and err.value.field == "messages[2].content"


def test_no_chat_template_is_an_error(chatml_tok):
    tok = chatml_tok.__class__.from_pretrained(chatml_tok.name_or_path)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        check_chat_template(tok)


TOOL_CONV = [
    {"role": "user", "content": "What is 6*7? Use the calculator."},
    {"role": "assistant", "content": "Let me check."},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "The answer is 42."},
]


@pytest.mark.parametrize("fixture", ["chatml_tok", "qwen3_tok", "llama3_tok"])
def test_tool_turns_not_supervised(request, fixture):
    tok = request.getfixturevalue(fixture)
    ids, mask = tokenize_messages(tok, TOOL_CONV, opts(), "t:1")
    eot = {"chatml_tok": "<|im_end|>", "qwen3_tok": "<|im_end|>", "llama3_tok": "<|eot_id|>"}[fixture]
    assert spans(tok, ids, mask) == [f"Let me check.{eot}", f"The answer is 42.{eot}"]


def test_template_exception_is_a_data_error(chatml_tok):
    tok = chatml_tok.__class__.from_pretrained(chatml_tok.name_or_path)
    tok.chat_template = ("{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('must start with user') }}"
                         "{% endif %}" + chatml_tok.chat_template)
    with pytest.raises(DataError) as err:
        tokenize_messages(tok, [{"role": "assistant", "content": "hi"}], opts(), "f.jsonl:4")
    assert err.value.reason == "template_error" and "must start with user" in str(err.value)
