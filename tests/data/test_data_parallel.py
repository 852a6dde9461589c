"""Parallel tokenization (``data.num_workers``) gives the serial result: same rows, same
order, same skip report, the same cache entry."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from data_helpers import write_jsonl

import dflash_train.data.tokenize as tokenize
from dflash_train.data import DataConfig, DataError, SkipReport, load_tokenized
from dflash_train.data.readers import read_records

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()  # noqa: SIM905


def rows(n: int = 300) -> list:
    out = []
    for i in range(n):
        answer = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 23))
        out.append({"messages": [{"role": "user", "content": f"Question {i}?"},
                                 {"role": "assistant", "content": answer}]})
    out[17] = "{broken"  # a reader skip, counted in order
    out[101] = {"messages": [{"role": "user", "content": "only user"}]}
    return out


def _tokenize(path, tok, workers: int, strict: bool = False):
    report = SkipReport()
    opts = tokenize.TokenizeOptions(max_length=64, min_supervised_tokens=8)
    out = list(tokenize.tokenize_records(read_records([str(path)], report, strict), tok, opts, report, strict,
                                         num_workers=workers))
    return out, report


def test_parallel_equals_serial(tmp_path, chatml_tok):
    path = write_jsonl(tmp_path / "d.jsonl", rows())
    serial, serial_report = _tokenize(path, chatml_tok, workers=1)
    parallel, parallel_report = _tokenize(path, chatml_tok, workers=2)
    assert parallel == serial
    assert parallel_report.to_dict() == serial_report.to_dict()
    assert serial_report.skipped["too_few_supervised"] > 0 and serial_report.kept == len(serial)


def test_parallel_strict_raises_the_first_bad_record(tmp_path, chatml_tok):
    path = write_jsonl(tmp_path / "d.jsonl", [r for r in rows() if not isinstance(r, str) and len(r["messages"]) > 1])
    with pytest.raises(DataError, match=r"d\.jsonl:1: field 'messages': too_few_supervised"):
        _tokenize(path, chatml_tok, workers=1, strict=True)
    with pytest.raises(DataError, match=r"d\.jsonl:1: field 'messages': too_few_supervised"):
        _tokenize(path, chatml_tok, workers=2, strict=True)


def test_cache_entry_is_the_same_serial_or_parallel(tmp_path, chatml_tok):
    write_jsonl(tmp_path / "d.jsonl", rows())

    def build(workers: int, cache: str):
        cfg = DataConfig(paths=[str(tmp_path / "d.jsonl")], cache_dir=str(tmp_path / cache), max_length=64,
                         token_budget=128, min_supervised_tokens=8, num_workers=workers)
        start = time.perf_counter()
        ds, report = load_tokenized(cfg, chatml_tok, block_size=4)
        return ds, report, time.perf_counter() - start

    serial, serial_report, _ = build(0, "serial")
    parallel, parallel_report, _ = build(2, "parallel")
    assert pa.Table.equals(serial.data.table, parallel.data.table)
    assert serial.cache_files[0]["filename"].split("/")[-2] == parallel.cache_files[0]["filename"].split("/")[-2]
    assert serial_report.to_dict() == parallel_report.to_dict()


def test_num_workers_validation():
    with pytest.raises(ValueError, match="data.num_workers"):
        DataConfig(paths=["x"], num_workers=-1).validate()
    with pytest.raises(ValueError, match="data.pack"):
        DataConfig(paths=["x"], pack="yes").validate()


def test_a_workers_initializer_and_task_give_the_serial_rows(tmp_path, chatml_tok, monkeypatch):
    """The pool's initializer and task called in this process: in a forked worker neither
    coverage nor a mutation tester sees them (issue 60.4 reported their 22 mutants "no tests").
    A chunk gives the serial path's rows and failure tuples, with the options the initializer
    was given, not the defaults."""
    path = write_jsonl(tmp_path / "d.jsonl", rows(120))
    records = list(read_records([str(path)], SkipReport(), False))
    opts = tokenize.TokenizeOptions(max_length=56, min_supervised_tokens=7)
    worker = {}
    monkeypatch.setattr(tokenize, "_WORKER", worker)
    tokenize._init_worker(chatml_tok, opts)
    assert worker == {"tokenizer": chatml_tok, "opts": opts, "specials": tokenize.special_ids(chatml_tok)}
    chunk = tokenize._work(records)
    assert chunk == list(tokenize._serial(records, chatml_tok, opts))
    assert len(chunk) == len(records) and any(isinstance(r, tuple) for r in chunk)
    assert any(isinstance(r, dict) and r["cut"].truncated for r in chunk)
    assert chunk != list(tokenize._serial(records, chatml_tok, tokenize.TokenizeOptions(min_supervised_tokens=7)))
