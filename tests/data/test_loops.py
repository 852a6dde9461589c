"""data.trim_loops: answers ending in a repetition loop keep two periods of it, the rest goes."""

from __future__ import annotations

import pytest
from data_helpers import SMOLLM2, write_jsonl

from dflash_train.data import DataConfig, cli, load_tokenized
from dflash_train.data.loops import loop_cut, trailing_loop, trim_looping_tails
from dflash_train.train.checkpoint import config_differences

PREFIX = list(range(1000, 1020))  # 20 distinct tokens that repeat nothing
PHRASE = [7, 8, 9, 10, 11, 12, 13]


def test_exact_loop_keeps_two_periods():
    tokens = PREFIX + PHRASE * 8
    assert trailing_loop(tokens) == (20, 7)
    assert loop_cut(tokens) == 34


def test_loop_of_period_one():
    tokens = PREFIX + [5] * 40
    assert trailing_loop(tokens) == (20, 1) and loop_cut(tokens) == 22


def test_loop_cut_mid_period_and_a_retokenized_last_token():
    tokens = PREFIX + PHRASE * 6 + PHRASE[:3]  # the length cap fell inside a period
    assert trailing_loop(tokens) == (20, 7)
    assert trailing_loop(tokens + [999]) == (20, 7)  # the cut word re-tokenized differently


def test_near_loops_are_untouched():
    numbered = PREFIX + [t for i in range(8) for t in [500 + i, *PHRASE]]  # "1. x 2. x 3. x ..."
    assert trailing_loop(numbered) is None
    assert trailing_loop(PREFIX + PHRASE * 4) is None  # 28 tokens: too short
    assert trailing_loop(PREFIX + list(range(40)) * 2) is None  # two periods only
    assert trailing_loop(PREFIX + [5] * 31) is None
    assert trailing_loop(PREFIX) is None and trailing_loop([]) is None


def test_trim_cuts_the_last_turn_and_masks_an_earlier_one():
    eot = 2
    turn1 = PREFIX + PHRASE * 8  # loops: positions 3 .. 78, then its end-of-turn at 79
    turn2 = PREFIX + [5] * 40
    ids = [1, 1, 1] + turn1 + [eot] + [1, 1] + turn2 + [eot, 3]
    mask = [0] * 3 + [1] * (len(turn1) + 1) + [0, 0] + [1] * (len(turn2) + 1) + [0]
    seg1 = list(range(3, 3 + len(turn1) + 1))
    seg2 = list(range(seg1[-1] + 3, seg1[-1] + 3 + len(turn2) + 1))
    out_ids, out_mask, tails, removed = trim_looping_tails(ids, mask, [seg1, seg2], {eot})
    assert tails == 2
    cut2 = seg2[0] + 22  # the last turn: the row ends after two periods
    assert out_ids == ids[:cut2] and out_mask[seg2[0]:] == [1] * 22
    cut1 = seg1[0] + 34  # the earlier turn stays as context, unsupervised after its cut
    assert out_mask[:cut1] == mask[:cut1] and out_mask[cut1:seg1[-1] + 1] == [0] * (len(seg1) - 34)
    assert removed == (len(seg1) - 34) + (len(seg2) - 22) == sum(mask) - sum(out_mask)


def _conversations():
    loop = "Here is my answer. " + "I like cats and dogs very much. " * 20 + "I like ca"
    clean = "Cats are small. Dogs are loyal and friendly, and both make good pets for many people."
    return [
        {"messages": [{"role": "user", "content": "Tell me about pets."}, {"role": "assistant", "content": loop}]},
        {"messages": [{"role": "user", "content": "Pets?"}, {"role": "assistant", "content": loop},
                      {"role": "user", "content": "And?"}, {"role": "assistant", "content": clean}]},
        {"messages": [{"role": "user", "content": "Pets, briefly?"}, {"role": "assistant", "content": clean}]},
    ]


def _supervised_text(tok, row) -> list[str]:
    runs, run = [], []
    for t, m in zip(row["input_ids"] + [None], row["loss_mask"] + [0]):
        if m:
            run.append(t)
        elif run:
            runs.append(tok.decode(run))
            run = []
    return runs


def test_trim_loops_end_to_end_with_the_real_tokenizer(tmp_path, chatml_tok):
    """Through load_tokenized (cache included): the off-run must not be served to the on-run."""
    write_jsonl(tmp_path / "d.jsonl", _conversations())
    base = {"paths": [str(tmp_path / "d.jsonl")], "cache_dir": str(tmp_path / "cache"), "max_length": 1024,
            "token_budget": 1024, "min_supervised_tokens": 8}
    plain, plain_report = load_tokenized(DataConfig(**base), chatml_tok, block_size=4)
    trimmed, report = load_tokenized(DataConfig(**base, trim_loops=True), chatml_tok, block_size=4)
    kept = "Here is my answer. I like cats and dogs very much. I like cats and dogs very much"
    clean = "Cats are small. Dogs are loyal and friendly, and both make good pets for many people.<|im_end|>"
    assert _supervised_text(chatml_tok, trimmed[0]) == [kept]  # last turn: the row ends there
    assert trimmed[0]["input_ids"] == plain[0]["input_ids"][: trimmed[0]["length"]]
    assert chatml_tok.decode(trimmed[0]["input_ids"]).endswith(kept)
    assert _supervised_text(chatml_tok, trimmed[1]) == [kept, clean]  # middle turn: masked, kept as context
    assert trimmed[1]["input_ids"] == plain[1]["input_ids"]
    assert trimmed[2] == plain[2]
    removed = sum(plain["num_supervised"]) - sum(trimmed["num_supervised"])
    assert removed > 250 and report.trimmed == {"tails": 2, "tokens": removed,
                                                "supervised": sum(plain["num_supervised"])}
    assert f"trimmed 2 looping tails, {removed} tokens" in report.format()
    assert plain_report.trimmed is None and "looping" not in plain_report.format()
    _, again = load_tokenized(DataConfig(**base, trim_loops=True), chatml_tok, block_size=4)  # from the cache
    assert again.trimmed == report.trimmed


def test_inspect_reports_trimmed_tails(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", _conversations())
    rc = cli.main(["data", "inspect", "--data", str(data), "--tokenizer", str(SMOLLM2), "--block-size", "4",
                   "--cache-dir", str(tmp_path / "c"), "--no-color", "--trim-loops"])
    out = capsys.readouterr().out
    assert rc == 0 and "trimmed 2 looping tails" in out


def test_a_checkpoint_from_before_the_option_resumes_with_it_off():
    saved = {"data": {"paths": ["a"], "pack": True}}  # written before data.trim_loops existed
    assert config_differences(saved, {"data": {"paths": ["a"], "pack": True, "trim_loops": False}}) == []
    assert config_differences(saved, {"data": {"paths": ["a"], "pack": True, "trim_loops": True}}) == [
        "data.trim_loops: checkpoint False vs now True"]
    with pytest.raises(ValueError, match="data.trim_loops: expected true or false"):
        DataConfig(paths=["a"], trim_loops="yes").validate()
