"""Bad data fails before the target's weights are read: a user whose data set has nothing
usable in it gets the skip report in seconds, not after minutes of loading a large target."""

import json
from pathlib import Path

import pytest
import transformers
from testkit import tiny_chat_job

from dflash_train.config import config_from_dict
from dflash_train.distributed.launch import run
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


def _job_with_short_answers(tmp_path) -> dict:
    """Every answer is one word: too few supervised tokens for a block of 4 (all skipped)."""
    job = tiny_chat_job(tmp_path)
    data = tmp_path / "short.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"},
                                                       {"role": "assistant", "content": "Yes."}]})
                              for i in range(5)) + "\n")
    job["data"]["paths"] = [str(data)]
    job["target"]["path"] = str(SMOLLM2)
    return job


@pytest.fixture
def weights_must_not_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the target's weights were loaded before the data was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize("entry", ["train", "launch"])
def test_unusable_data_fails_before_the_target_loads(tmp_path, weights_must_not_load, monkeypatch, entry):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = config_from_dict(_job_with_short_answers(tmp_path))
    with pytest.raises(ValueError, match="no usable training examples") as err:
        train(cfg) if entry == "train" else run(cfg)
    assert "short.jsonl" in str(err.value) and "too_few_supervised" in str(err.value)


def test_usable_data_is_cached_by_the_check_and_read_back_by_the_trainer(tmp_path, weights_must_not_load):
    """The check tokenizes into the cache; with weights refused the run stops at the load, and
    the cache entry is there for the trainer (no second tokenization)."""
    job = tiny_chat_job(tmp_path)
    job["target"]["path"] = str(SMOLLM2)
    with pytest.raises(AssertionError, match="weights were loaded"):
        train(config_from_dict(job))
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and ".tmp-" not in p.name]
    assert len(entries) == 1
