"""load_tokenized: cached on disk, reused on a second run, rebuilt when any key changes."""

from __future__ import annotations

import pytest
from data_helpers import write_jsonl

import dflash_train.data as data
from dflash_train.data import DataConfig, load_tokenized

ROWS = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                      {"role": "assistant", "content": f"Answer number {i} is here, in words."}]}
        for i in range(5)] + ["{broken", {"messages": [{"role": "user", "content": "only user"}]}]


@pytest.fixture
def counter(monkeypatch):
    calls = []
    real = data.tokenize_records

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(data, "tokenize_records", counting)
    return calls


def cfg(tmp_path, **kw):
    kw = {"min_supervised_tokens": 2, "max_length": 256, "token_budget": 512, **kw}
    return DataConfig(paths=[str(tmp_path / "d.jsonl")], cache_dir=str(tmp_path / "cache"), **kw)


def test_load_report_and_columns(tmp_path, chatml_tok, counter):
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    ds, report = load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    assert len(ds) == 5 and report.read == 7 and report.kept == 5
    assert report.read == report.kept + report.total_skipped
    assert report.skipped == {"malformed_json": 1, "no_assistant_turn": 1}
    row = ds[0]
    assert row["length"] == len(row["input_ids"]) == len(row["loss_mask"])
    assert row["num_supervised"] == sum(row["loss_mask"]) > 0


def test_cache_reused_and_invalidated(tmp_path, chatml_tok, llama3_tok, counter):
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    first, _ = load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    second, report = load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    assert len(counter) == 1 and second["input_ids"] == first["input_ids"] and report.kept == 5
    load_tokenized(cfg(tmp_path, supervise="last"), chatml_tok, block_size=4)  # option
    assert len(counter) == 2
    load_tokenized(cfg(tmp_path, min_supervised_tokens=None), chatml_tok, block_size=5)  # 10
    assert len(counter) == 3
    load_tokenized(cfg(tmp_path), llama3_tok, block_size=4)  # tokenizer + template
    assert len(counter) == 4
    tok = chatml_tok.__class__.from_pretrained(chatml_tok.name_or_path)
    tok.chat_template = chatml_tok.chat_template.replace("helpful AI", "kind AI")  # template only
    load_tokenized(cfg(tmp_path), tok, block_size=4)
    assert len(counter) == 5
    write_jsonl(tmp_path / "d.jsonl", ROWS[:4])  # data content
    ds, _ = load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    assert len(counter) == 6 and len(ds) == 4
    load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    assert len(counter) == 6


def test_strict_and_config_errors(tmp_path, chatml_tok):
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(data.DataError, match="d.jsonl:6"):
        load_tokenized(cfg(tmp_path, strict=True), chatml_tok, block_size=4)
    assert not list((tmp_path / "cache").glob("*.tmp-*"))  # no half-written entry left behind
    with pytest.raises(ValueError, match="data.supervise"):
        load_tokenized(cfg(tmp_path, supervise="first"), chatml_tok, block_size=4)
    with pytest.raises(ValueError, match="data.paths"):
        DataConfig(paths="x.jsonl").validate()
    with pytest.raises(ValueError, match="no usable"):
        load_tokenized(cfg(tmp_path, min_supervised_tokens=10_000), chatml_tok, block_size=4)
    tok = chatml_tok.__class__.from_pretrained(chatml_tok.name_or_path)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenized(cfg(tmp_path), tok, block_size=4)


def test_validate_budget_against_padded_max_length():
    DataConfig(paths=["x"], max_length=1000, token_budget=1024).validate()
    with pytest.raises(ValueError, match="data.token_budget"):
        DataConfig(paths=["x"], max_length=1000, token_budget=1000).validate()
    with pytest.raises(ValueError, match="data.max_length"):
        DataConfig(paths=["x"], max_length=0).validate()


def test_max_examples_is_a_fixed_nested_subset_sharing_the_cache(tmp_path, chatml_tok, counter):
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    full, _ = load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    rows = [tuple(r) for r in full["input_ids"]]
    picked = {}
    for n in (2, 3, 5, 50):
        ds, _ = load_tokenized(cfg(tmp_path, max_examples=n), chatml_tok, block_size=4)
        picked[n] = [tuple(r) for r in ds["input_ids"]]
        assert len(picked[n]) == min(n, 5)
        assert [rows.index(r) for r in picked[n]] == sorted(rows.index(r) for r in picked[n])  # original order
    assert set(picked[2]) <= set(picked[3]) <= set(picked[5])  # nested: a scaling curve adds data
    assert picked[5] == picked[50] == rows
    again, _ = load_tokenized(cfg(tmp_path, max_examples=3), chatml_tok, block_size=4)
    assert [tuple(r) for r in again["input_ids"]] == picked[3]  # deterministic
    assert len(counter) == 1  # every size reused the one tokenized cache entry
    with pytest.raises(ValueError, match="max_examples"):
        DataConfig(paths=["x"], max_examples=0).validate()


def test_a_second_builder_of_the_same_entry_keeps_the_published_one(tmp_path):
    """Runs started together build the same entry; the later one must not remove the
    entry that the first published (and may already have loaded)."""
    from dflash_train.data.cache import DATA_FILE, load_cached, write_entry
    from dflash_train.data.errors import SkipReport

    row = {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "length": 3, "num_supervised": 2}
    entry = tmp_path / "key"
    write_entry(entry, [row], SkipReport())
    first, _ = load_cached(entry)
    inode = (entry / DATA_FILE).stat().st_ino
    write_entry(entry, [row, row], SkipReport())  # a slower builder finishing later
    assert (entry / DATA_FILE).stat().st_ino == inode
    assert len(load_cached(entry)[0]) == 1 and first[0]["input_ids"] == [1, 2, 3]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    (entry / DATA_FILE).unlink()  # a partial entry (an old crash) is replaced
    write_entry(entry, [row, row], SkipReport())
    assert len(load_cached(entry)[0]) == 2


def test_an_entry_whose_bytes_changed_but_still_parse_is_tokenized_again(tmp_path, chatml_tok, counter, capsys):
    """Token ids zeroed inside ``data.arrow`` still parse as Arrow: only the entry's checksums see it.
    The entry is rebuilt (one note) and the rows are the ones first tokenized, never the damaged ones."""
    import numpy as np

    write_jsonl(tmp_path / "d.jsonl", ROWS)
    first, _ = load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    want = [list(row["input_ids"]) for row in first]
    [entry] = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    arrow = entry / "data.arrow"
    raw = bytearray(arrow.read_bytes())
    ids = np.asarray(want[0][:8], dtype="<i4").tobytes()
    at = raw.find(ids)
    assert at > 0, "the first row's token ids are stored as plain little-endian int32"
    raw[at:at + len(ids)] = bytes(len(ids))
    del first
    arrow.write_bytes(bytes(raw))
    again, _ = load_tokenized(cfg(tmp_path), chatml_tok, block_size=4)
    assert [list(row["input_ids"]) for row in again] == want
    assert len(counter) == 2  # tokenized once, then again for the damaged entry
    assert "is corrupt (data.arrow does not match its sha256 checksum" in capsys.readouterr().err
