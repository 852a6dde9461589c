"""data.max_lookup_tau: how much of an answer n-gram prompt lookup drafts, and the skip it drives."""

from __future__ import annotations

import random

import pytest
from data_helpers import SMOLLM2, write_jsonl

from dflash_train.data import DataConfig, cli, load_tokenized
from dflash_train.data.lookup import lookup_tau, reference_lookup_tau


def test_fast_walk_equals_the_brute_force_scan():
    rng = random.Random(0)
    for _ in range(400):
        n, vocab = rng.randint(1, 90), rng.choice([2, 3, 6, 40])
        ids = [rng.randrange(vocab) for _ in range(n)]
        mask = [int(rng.random() > 0.3) for _ in range(n)]
        assert lookup_tau(ids, mask) == reference_lookup_tau(ids, mask)


def test_hand_examples():
    fresh = list(range(10, 40))
    assert lookup_tau(fresh, [1] * len(fresh)) == 1.0  # nothing repeats: one token per step
    # the answer restates the 20-token prompt: the first token is new (one step), then the draft
    # follows the prompt 15 tokens (+1 of the target's) per step
    prompt = list(range(100, 120))
    ids, mask = prompt + prompt, [0] * 20 + [1] * 20
    assert lookup_tau(ids, mask) == 20 / 3  # steps: [100], [101..116], [117..119]
    # drafts only use tokens known at the step: a period-1 run drafts one token at a time
    run = [5] * 12
    assert lookup_tau(run, [1] * 12) == 12 / 7


def _copier(i: int) -> dict:
    text = (f"Please repeat exactly: the quick brown fox {i} jumps over the lazy dog near the river bank "
            "while the sun sets slowly behind the tall green hills of the quiet valley.")
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text}]}


def _writer(i: int) -> dict:
    answer = ("Photosynthesis lets plants turn light, water and carbon dioxide into sugar and oxygen. "
              f"Chlorophyll in the leaves absorbs mostly red and blue light; note {i}. The sugar feeds growth, "
              "and the oxygen escapes through small pores called stomata.")
    return {"messages": [{"role": "user", "content": "What is photosynthesis?"},
                         {"role": "assistant", "content": answer}]}


def test_copied_answers_are_counted_skips_through_the_cache(tmp_path, chatml_tok):
    rows = [_copier(0), _writer(1), _copier(2), _writer(3)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    base = {"paths": [str(data)], "cache_dir": str(tmp_path / "cache"), "min_supervised_tokens": 8}
    all_rows, all_report = load_tokenized(DataConfig(**base), chatml_tok, block_size=4)
    kept, report = load_tokenized(DataConfig(**base, max_lookup_tau=2.0), chatml_tok, block_size=4)
    assert len(all_rows) == 4 and all_report.skipped == {}
    assert report.kept == 2 and report.skipped == {"mostly_copied": 2}
    assert [r["input_ids"] for r in kept] == [all_rows[1]["input_ids"], all_rows[3]["input_ids"]]
    assert f"{data}:1" in report.format() and "mostly_copied: 2" in report.format()
    for row, expect_high in zip(all_rows, [True, False, True, False]):
        tau = lookup_tau(row["input_ids"], row["loss_mask"])
        assert (tau > 2.0) == expect_high, tau


def test_inspect_flag_and_config_checks(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [_copier(0), _writer(1)])
    rc = cli.main(["data", "inspect", "--data", str(data), "--tokenizer", str(SMOLLM2), "--block-size", "4",
                   "--cache-dir", str(tmp_path / "c"), "--no-color", "--max-lookup-tau", "2"])
    assert rc == 0 and "mostly_copied: 1" in capsys.readouterr().out
    for bad in (0.5, "2", True):
        with pytest.raises(ValueError, match="data.max_lookup_tau"):
            DataConfig(paths=["a"], max_lookup_tau=bad).validate()
