"""Plain-text training data: records with a ``text`` field, loss on every token after the first."""

from __future__ import annotations

import copy

import pytest
from data_helpers import write_jsonl

from dflash_train.data import BatchPlan, DataConfig, DataError, SkipReport, load_tokenized
from dflash_train.data.readers import read_records

DOCS = ["def add(a, b):\n    return a + b\n", "The cat sat on the mat and looked at the dog.",
        "Plain documents have no turns: every token is something the drafter should learn to predict."]


def cfg(tmp_path, name="d.jsonl", **kw):
    kw = {"min_supervised_tokens": 2, "max_length": 128, "token_budget": 256, "pad_to_multiple": 32, **kw}
    return DataConfig(paths=[str(tmp_path / name)], cache_dir=str(tmp_path / "cache"), **kw)


@pytest.fixture
def base_tok(chatml_tok):
    """The SmolLM2 vocabulary as a base model's tokenizer: no chat template."""
    tok = copy.deepcopy(chatml_tok)
    tok.chat_template = None
    return tok


def test_text_rows_supervise_every_token_after_the_first(tmp_path, base_tok):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in DOCS])
    ds, report = load_tokenized(cfg(tmp_path), base_tok, block_size=4)
    assert report.read == report.kept == 3 and report.total_skipped == 0
    for row, text in zip(ds, DOCS):
        expected = base_tok(text, add_special_tokens=True)["input_ids"] + [base_tok.eos_token_id]
        assert row["input_ids"] == expected  # the document, closed by EOS
        assert row["loss_mask"] == [0] + [1] * (len(expected) - 1)
        assert row["num_supervised"] == len(expected) - 1 and row["length"] == len(expected)


def test_text_rows_pack_like_chat_rows(tmp_path, base_tok):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in DOCS * 4])
    ds, _ = load_tokenized(cfg(tmp_path, pack=True), base_tok, block_size=4)
    plan = BatchPlan(ds["length"], token_budget=256, seed=0, pad_to_multiple=32, pack_length=128)
    rows = [row for mb in plan.epoch_micro_batches(0) for row in mb]
    assert sorted(i for row in rows for i in row) == list(range(len(ds)))  # every document once
    assert any(len(row) > 1 for row in rows)  # several documents share a row


def test_a_file_mixing_kinds_is_a_counted_skip_naming_the_line(tmp_path):
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path = write_jsonl(tmp_path / "m.jsonl", [{"text": "a document"}, chat, {"text": "another"}])
    report = SkipReport()
    records = list(read_records([str(path)], report))
    assert [r.text for r in records] == ["a document", "another"]
    assert report.skipped == {"mixed_kinds": 1} and report.examples["mixed_kinds"] == [f"{path}:2 (messages)"]
    with pytest.raises(DataError, match=r"m\.jsonl:2: field 'messages': mixed_kinds"):
        list(read_records([str(path)], SkipReport(), strict=True))


def test_separate_files_may_hold_different_kinds(tmp_path, chatml_tok):
    write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in DOCS])
    write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "Say something long."},
                                                     {"role": "assistant", "content": DOCS[2]}]}])
    data = DataConfig(paths=[str(tmp_path / "t.jsonl"), str(tmp_path / "c.jsonl")], min_supervised_tokens=2,
                      max_length=128, token_budget=256, cache_dir=str(tmp_path / "cache"))
    ds, report = load_tokenized(data, chatml_tok, block_size=4)
    assert report.kept == 4 and report.total_skipped == 0
    assert ds[0]["loss_mask"][0] == 0 and all(ds[0]["loss_mask"][1:])  # text: everything after the first
    assert sum(ds[3]["loss_mask"]) < ds[3]["length"] - 5  # chat: the prompt is not supervised


def test_empty_text_is_a_counted_skip(tmp_path, base_tok):
    write_jsonl(tmp_path / "d.jsonl", [{"text": DOCS[1]}, {"text": "   "}, {"text": 7}])
    _, report = load_tokenized(cfg(tmp_path), base_tok, block_size=4)
    assert report.kept == 1 and report.skipped == {"empty_text": 1, "wrong_type": 1}


def test_chat_records_without_a_template_name_the_real_key(tmp_path, base_tok):
    write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                     {"role": "assistant", "content": "hello there"}]}])
    with pytest.raises(ValueError, match=r"has no chat template.*set data\.chat_template"):
        load_tokenized(cfg(tmp_path), base_tok, block_size=4)


def test_parquet_text_records(tmp_path, base_tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": DOCS}), tmp_path / "d.parquet")
    ds, report = load_tokenized(cfg(tmp_path, name="d.parquet"), base_tok, block_size=4)
    assert report.kept == 3 and ds[1]["loss_mask"] == [0] + [1] * (ds[1]["length"] - 1)
