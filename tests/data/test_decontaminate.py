"""Evaluation prompts never reach training: planted copies, containments and paraphrases are
dropped and counted by the data loader (and by regenerate's reader), innocent records stay."""

from __future__ import annotations

import json

import pytest
from data_helpers import write_jsonl

from dflash_train.config import config_from_dict
from dflash_train.data import DataConfig, load_tokenized
from dflash_train.data.decontaminate import EvalPrompts, drop_eval_prompts, evaluation_prompts
from dflash_train.data.errors import SkipReport
from dflash_train.data.prompt_sets import prompt_set_path
from dflash_train.data.readers import read_records

ANSWER = "Here is a careful answer with enough words in it to be kept as a training example for the drafter."


def _first_line(name: str) -> str:
    return prompt_set_path(name).read_text().splitlines()[0].strip()


def _chat(user: str, answer: str = ANSWER) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def _planted(own_prompt: str) -> tuple[list[dict], list[str]]:
    """Records that ask an evaluation prompt (each a different way), then innocent ones (by their user text)."""
    heldout, selection = _first_line("heldout"), _first_line("selection")
    assert heldout == "What are three good habits for staying productive while working from home?"
    bad = [
        _chat(heldout),  # verbatim
        _chat(heldout.upper().replace("?", "!!")),  # equal after normalization
        _chat(f"My boss asked me this morning: {heldout} Answer briefly."),  # contained
        _chat("Good habits for staying productive while working from home: name three."),  # near: a paraphrase
        _chat(selection),  # the selection set is never trained on either
        {"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": ANSWER},
                           {"from": "human", "value": own_prompt}, {"from": "gpt", "value": ANSWER}]},  # a later turn
    ]
    innocent = ["Write a poem about the sea at night.", "How do I bake sourdough bread at home?",
                "What is a good habit to start this year?"]  # shares words, is not near
    return bad + [_chat(u) for u in innocent], innocent


def test_the_loader_drops_and_counts_every_planted_copy_and_keeps_the_rest(tmp_path, chatml_tok):
    own = tmp_path / "my_eval.txt"
    own.write_text("Describe the migration route of the arctic tern.\n")
    records, innocent = _planted("Describe the migration route of the arctic tern.")
    data = write_jsonl(tmp_path / "train.jsonl", records)
    cfg = DataConfig(paths=[str(data)], cache_dir=str(tmp_path / "cache"), min_supervised_tokens=1,
                     exclude_prompts=[str(own)])
    ds, report = load_tokenized(cfg, chatml_tok, block_size=4)
    assert report.skipped["eval_prompt"] == 6 and report.kept == len(innocent) == len(ds)
    kept_users = [chatml_tok.decode(row) for row in ds["input_ids"]]
    assert all(any(u in text for text in kept_users) for u in innocent)
    assert "eval_prompt: 6" in report.format() and "data.exclude_eval_prompts=false" in report.format()
    assert report.examples["eval_prompt"][0].startswith(f"{data}:1 (messages[0].content)")

    # turned off: everything trains (the cache is keyed by the option, not reused)
    off, off_report = load_tokenized(DataConfig(**{**vars(cfg), "exclude_eval_prompts": False}), chatml_tok, 4)
    assert len(off) == len(records) and "eval_prompt" not in off_report.skipped
    # without the job's own prompt file, the record asking it stays
    _, partial = load_tokenized(DataConfig(**{**vars(cfg), "exclude_prompts": []}), chatml_tok, 4)
    assert partial.skipped["eval_prompt"] == 5


def test_plain_text_is_matched_by_containment_only():
    prompts = EvalPrompts(["What is the difference between weather and climate?"])
    text_records = [
        {"text": "Lecture notes. What is the difference between weather and climate? Weather is daily."},
        {"text": "Climate and weather differ: the difference between them is the time scale we study."},
    ]
    report = SkipReport()
    path_records = [type("R", (), {"text": r["text"], "messages": [], "location": f"f:{i}"})()
                    for i, r in enumerate(text_records, 1)]
    kept = list(drop_eval_prompts(path_records, prompts, report))
    assert [r.location for r in kept] == ["f:2"] and report.skipped["eval_prompt"] == 1


def test_regenerate_reader_skips_them_too(tmp_path):
    records, innocent = _planted("a prompt only this job evaluates on, about arctic terns")
    data = write_jsonl(tmp_path / "prompts.jsonl", records)
    report = SkipReport()
    kept = list(drop_eval_prompts(read_records([str(data)], report), evaluation_prompts(), report))
    assert [r.messages[0]["content"] for r in kept] == ["hello", *innocent]
    assert report.skipped["eval_prompt"] == 5  # the sixth asks a prompt that no packaged set holds


def test_the_job_eval_prompts_join_data_exclude_prompts(tmp_path):
    own = tmp_path / "p.txt"
    own.write_text("One prompt.\n")
    job = config_from_dict({"data": {"paths": ["x.jsonl"]}, "eval": {"prompts": str(own)}})
    assert job.data.exclude_prompts == [str(own)] and job.data.exclude_eval_prompts is True
    named = config_from_dict({"data": {"paths": ["x.jsonl"]}, "eval": {"prompts": "heldout"}})
    assert named.data.exclude_prompts == []  # the packaged sets are always excluded
    with pytest.raises(ValueError, match="data.exclude_prompts: nope.txt"):
        DataConfig(paths=["x"], exclude_prompts=["nope.txt"]).validate()


def test_the_committed_answer_sets_hold_the_counted_near_copies(tmp_path):
    """Answer sets 1 and 2 were built before the filter existed: 16 near-copies of held-out prompts
    and 31 of selection prompts, by the loader's own rule (issue 49's count)."""
    import tarfile

    from data_helpers import REPO

    prompts = {name: EvalPrompts(prompt_set_path(name).read_text().splitlines()) for name in ("heldout", "selection")}
    counts = {"heldout": 0, "selection": 0}
    for n in (1, 2):
        with tarfile.open(REPO / "docs" / "results" / "data" / f"greedy-answers-{n}.tar.xz") as tar:
            member = tar.extractfile(tar.getmembers()[0])
            for line in member:
                user = next(m["content"] for m in json.loads(line)["messages"] if m["role"] == "user")
                for name, p in prompts.items():
                    counts[name] += p.match(user) is not None
    assert counts == {"heldout": 16, "selection": 31}
