"""Readers: every format normalises the same; every bad input is a counted skip or a strict error."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_train.data.errors import DataError, SkipReport
from dflash_train.data.readers import read_records
from dflash_train.data.tokenize import TokenizeOptions, tokenize_records

EXPECTED = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2"}]
OPENAI = {"messages": EXPECTED}
SHAREGPT = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"},
                              {"from": "gpt", "value": "A"}, {"from": "human", "value": "Q2"},
                              {"from": "gpt", "value": "A2"}]}


def read(paths, strict=False):
    report = SkipReport()
    return list(read_records([str(p) for p in paths], report, strict)), report


def test_formats_normalise_identically(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [OPENAI, SHAREGPT])
    (tmp_path / "b.json").write_text(json.dumps([OPENAI]))
    pq.write_table(pa.Table.from_pylist([{"prompt": "Q", "response": "A", "system": "S"}]), tmp_path / "c.parquet")
    datasets.Dataset.from_list([SHAREGPT]).save_to_disk(str(tmp_path / "arrow"))
    records, report = read([tmp_path])
    # sorted walk: a.jsonl (2), arrow/ (save_to_disk), b.json, c.parquet (prompt/response)
    assert [r.messages for r in records] == [EXPECTED] * 4 + [EXPECTED[:3]]
    assert records[2].location.endswith("arrow:1") and records[4].location.endswith("c.parquet:1")
    assert report.read == 5 and report.total_skipped == 0
    assert records[0].location.endswith("a.jsonl:1") and records[1].id == "a.jsonl:2"


def test_reasoning_tool_and_content_parts(tmp_path):
    row = {"id": 7, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Q"}]},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": "A", "reasoning_content": "think"}]}
    (rec,), _ = read([write_jsonl(tmp_path / "r.jsonl", [row])])
    assert rec.id == "7" and rec.messages[0]["content"] == "Q" and rec.messages[2]["role"] == "tool"
    assert rec.messages[3] == {"role": "assistant", "content": "A", "reasoning_content": "think"}


BAD = [  # (line content, reason, field)
    ("{not json", "malformed_json", "<line>"),
    ('{"foo": 1}', "missing_field", "messages"),
    ('{"messages": "hi"}', "wrong_type", "messages"),
    ('{"messages": [{"role": "user", "content": 3}]}', "wrong_type", "messages[0].content"),
    ('{"messages": [{"role": "wizard", "content": "x"}]}', "unknown_role", "messages[0].role"),
    ('{"conversations": [{"from": "alien", "value": "x"}]}', "unknown_role", "conversations[0].from"),
    ('{"messages": []}', "empty_conversation", "messages"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "no_assistant_turn", "messages"),
    ('{"prompt": "x"}', "missing_field", "response"),
    ("[1, 2]", "not_an_object", "<record>"),
]


@pytest.mark.parametrize(("line", "reason", "field"), BAD)
def test_bad_input_counted_with_location(tmp_path, line, reason, field):
    path = write_jsonl(tmp_path / "d.jsonl", [OPENAI, line, OPENAI])
    records, report = read([path])
    assert len(records) == 2 and report.read == 3 and report.skipped == {reason: 1}
    assert report.examples[reason] == [f"{path}:2 ({field})"]
    assert f"{reason}: 1" in report.format()


@pytest.mark.parametrize(("line", "reason", "field"), BAD)
def test_bad_input_strict_names_file_line_field(tmp_path, line, reason, field):
    path = write_jsonl(tmp_path / "d.jsonl", [OPENAI, line])
    with pytest.raises(DataError) as err:
        read([path], strict=True)
    assert isinstance(err.value, ValueError) and err.value.reason == reason
    assert f"{path}:2" in str(err.value) and f"'{field}'" in str(err.value)


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(json.dumps(OPENAI).encode() + b"\n" + b'{"prompt": "\xff\xfe", "response": "x"}\n')
    records, report = read([path])
    assert len(records) == 1 and report.skipped == {"bad_encoding": 1}
    assert report.examples["bad_encoding"][0].startswith(f"{path}:2")
    with pytest.raises(DataError, match=f"{path}:2"):
        read([path], strict=True)


def test_missing_path_and_unsupported_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read([tmp_path / "nope.jsonl"])
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="unsupported"):
        read([tmp_path / "x.csv"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
message = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "assistant", "system", "tool", "bogus"]) | json_values,
    "content": st.text(max_size=5) | json_values, "reasoning_content": json_values})
turn = st.fixed_dictionaries({}, optional={"from": st.sampled_from(["human", "gpt", "x"]) | json_values,
                                           "value": st.text(max_size=5) | json_values})
record = (st.fixed_dictionaries({"messages": st.lists(message, max_size=4) | json_values})
          | st.fixed_dictionaries({"conversations": st.lists(turn, max_size=4) | json_values})
          | st.fixed_dictionaries({}, optional={"prompt": json_values, "response": json_values})
          | json_values)
line = record.map(json.dumps) | st.text(max_size=12).filter(lambda s: "\n" not in s and "\r" not in s)


@pytest.mark.parametrize("fixture", ["chatml_tok", "qwen3_tok", "llama3_tok"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(line, min_size=1, max_size=12))
def test_random_malformed_records_never_crash(tmp_path, request, fixture, lines):
    """Through reading and tokenization: every non-blank line is either kept or skipped for a reason."""
    tok = request.getfixturevalue(fixture)
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = SkipReport()
    records = read_records([str(path)], report)
    rows = list(tokenize_records(records, tok, TokenizeOptions(min_supervised_tokens=1), report))
    nonblank = sum(1 for s in lines if s.encode().strip())  # the reader skips ASCII-blank lines
    assert report.read == nonblank == report.kept + report.total_skipped and report.kept == len(rows)
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) == r["length"] for r in rows)


def test_malformed_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"messages": ')
    records, report = read([path])
    assert records == [] and report.skipped == {"malformed_json": 1}
    (tmp_path / "bad.json").write_text(json.dumps([OPENAI, {"messages": [{"role": "user"}]}]))
    with pytest.raises(DataError, match=r"bad.json:2: field 'messages\[0\].content'"):
        read([path], strict=True)
