"""The README's "Every step on a CPU" block, run as written: a tiny random model with SmolLM2's
tokenizer through data, training, export and evaluation (the commands a user copies must work)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from test_readme import readme, section

from dflash_train.assets import write_tiny_model
from dflash_train.cli import main
from dflash_train.files import UserFacingError
from dflash_train.models.target import Target

SMOLLM2 = Path(__file__).resolve().parents[1] / "assets" / "smollm2"
needs_smollm2 = pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="needs assets/smollm2 (make assets)")


def tiny_model_commands() -> list[list[str]]:
    """The block's commands after its tiny-model comment, continuation lines joined."""
    block = re.search(r"```bash\n(.*?)```", section(readme(), "Every step on a CPU"), flags=re.S).group(1)
    tail = block[block.index("# a tiny random model"):].split("\n", 1)[1]
    return [shlex.split(line) for line in tail.replace("\\\n", " ").splitlines() if line.strip()]


@needs_smollm2
def test_tiny_model_has_the_tokenizers_vocabulary_and_refuses_an_existing_folder(tmp_path):
    out = write_tiny_model(tmp_path / "m", SMOLLM2, num_layers=2, hidden=32)
    target = Target.load(out)
    assert len(target.layers) == 2 and target.facts.hidden_size == 32
    assert target.model.config.vocab_size == len(target.tokenizer)
    assert target.model.config.eos_token_id == target.tokenizer.eos_token_id
    with pytest.raises(UserFacingError, match="already exists"):
        write_tiny_model(out, SMOLLM2)


@pytest.mark.slow  # ~1.5 min on 2 CPU cores: 30 training steps and two small evaluations
@needs_smollm2
def test_the_readme_cpu_walkthrough_runs_as_written(tmp_path, monkeypatch):
    commands = tiny_model_commands()
    assert [c[:2] for c in commands] == [["dflash-train", "tiny-model"], ["dflash-train", "offline-data"],
                                         ["dflash-train", "train"], ["dflash-train", "export"],
                                         ["dflash-train", "eval"]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "assets").symlink_to(SMOLLM2.parent)
    for command in commands:
        assert main(command[1:]) == 0, command
    report = json.loads((tmp_path / "runs" / "tiny-eval" / "eval.json").read_text())
    assert report["lossless"]["ok"]
    assert (tmp_path / "runs" / "tiny-drafter" / "model.safetensors").exists()
