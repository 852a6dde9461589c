"""data.chat_template: a Jinja string or a .jinja file, honoured by the data and by any later use of
the tokenizer; error messages name only configuration keys that exist."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest
from data_helpers import write_jsonl

import dflash_train
from dflash_train.config import JobConfig, load_config
from dflash_train.data import DataConfig, load_tokenized, use_chat_template
from dflash_train.data.chat_template import read_chat_template

# A template unlike ChatML, so a row shows which template made it.
BRACKETS = ("{% for m in messages %}{{ '[' + m['role'] + ']: ' + m['content'] + eos_token + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '[assistant]: ' }}{% endif %}")
CONV = {"messages": [{"role": "user", "content": "What is two plus two?"},
                     {"role": "assistant", "content": "Two plus two is four, as everyone knows."}]}


@pytest.fixture
def base_tok(chatml_tok):
    tok = copy.deepcopy(chatml_tok)
    tok.chat_template = None
    return tok


def _cfg(tmp_path, template):
    return DataConfig(paths=[str(tmp_path / "d.jsonl")], max_length=128, token_budget=256, min_supervised_tokens=2,
                      cache_dir=str(tmp_path / "cache"), chat_template=template)


@pytest.mark.parametrize("as_file", [False, True])
def test_the_setting_formats_the_data_and_stays_on_the_tokenizer(tmp_path, base_tok, as_file):
    write_jsonl(tmp_path / "d.jsonl", [CONV])
    template = BRACKETS
    if as_file:
        (tmp_path / "brackets.jinja").write_text(BRACKETS)
        template = str(tmp_path / "brackets.jinja")
    ds, report = load_tokenized(_cfg(tmp_path, template), base_tok, block_size=4)
    assert report.kept == 1
    text = base_tok.decode(ds[0]["input_ids"])
    assert text.startswith("[user]: What is two plus two?") and "[assistant]: Two plus two" in text
    supervised = [t for t, m in zip(ds[0]["input_ids"], ds[0]["loss_mask"]) if m]
    # the space before the answer is part of its first token (" Two"): BPE merges it
    assert base_tok.decode(supervised).strip() == "Two plus two is four, as everyone knows." + base_tok.eos_token
    assert base_tok.chat_template == BRACKETS  # evaluation during training formats prompts the same way


def test_a_new_template_rebuilds_the_cache(tmp_path, chatml_tok):
    write_jsonl(tmp_path / "d.jsonl", [CONV])
    ds1, _ = load_tokenized(_cfg(tmp_path, None), copy.deepcopy(chatml_tok), block_size=4)
    ds2, _ = load_tokenized(_cfg(tmp_path, BRACKETS), copy.deepcopy(chatml_tok), block_size=4)
    assert ds1[0]["input_ids"] != ds2[0]["input_ids"]


def test_use_chat_template_for_evaluation(base_tok):
    tok = use_chat_template(base_tok, BRACKETS)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "[user]: hi" + tok.eos_token + "\n[assistant]: "
    assert use_chat_template(tok, None).chat_template == BRACKETS  # None keeps what is there


@pytest.mark.parametrize("value, words", [("missing.jinja", "neither a Jinja template"), ("", "expected a Jinja"),
                                          (3, "expected a Jinja")])
def test_bad_values_fail_at_validation_naming_the_key(value, words):
    with pytest.raises(ValueError, match=f"data.chat_template: .*{words}"):
        DataConfig(paths=["x.jsonl"], chat_template=value).validate()


def test_a_file_without_a_template_is_refused(tmp_path):
    (tmp_path / "t.jinja").write_text("just words")
    with pytest.raises(ValueError, match="holds no Jinja template"):
        read_chat_template(str(tmp_path / "t.jinja"))


def test_the_key_works_as_a_command_line_override(tmp_path):
    (tmp_path / "t.jinja").write_text(BRACKETS)
    cfg = load_config("cpu-demo", [f"data.chat_template={tmp_path / 't.jinja'}"])
    assert cfg.data.chat_template == str(tmp_path / "t.jinja")


# -- every configuration key an error message names exists --------------------------------

SECTIONS = {name: {f for f in getattr(JobConfig(), name).__dataclass_fields__}
            for name in JobConfig.__dataclass_fields__}
NOT_KEYS = {"jsonl", "json", "yaml", "sh", "py", "arrow", "parquet", "txt", "tmp", "gguf"}
DOTTED = re.compile(r"(?<![\w./-])(?P<section>[a-z_]+)\.(?P<key>[a-z_]+)\b(?![.(/])")


def _message_text(node: ast.AST) -> str:
    """The constant text of a raise's arguments (f-string placeholders as '{}')."""
    parts = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            parts.append(sub.value)
        elif isinstance(sub, ast.FormattedValue):
            parts.append("{}")
    return " ".join(parts)


def _messages(tree: ast.AST):
    """What is raised, what ``*message*`` functions return, and the skip reasons' words (``WHY``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            yield node.exc
        elif isinstance(node, ast.FunctionDef) and "message" in node.name:
            yield from (n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "WHY" for t in node.targets):
            yield node.value


def named_keys(source: str) -> list[str]:
    """``section.key`` words in error messages: a known section's, or any after 'set'."""
    found = []
    for message in _messages(ast.parse(source)):
        text = _message_text(message)
        for m in DOTTED.finditer(text):
            section, key = m["section"], m["key"]
            after_set = text[max(0, m.start() - 4): m.start()] == "set "
            if (section in SECTIONS or after_set) and key not in NOT_KEYS:
                found.append(f"{section}.{key}")
    return found


def test_the_old_message_would_fail():
    old = 'raise ValueError(f"tokenizer {n!r} has no chat template; set tokenizer.chat_template or ...")'
    assert named_keys(old) == ["tokenizer.chat_template"]
    assert "tokenizer" not in SECTIONS


def test_error_messages_name_only_existing_keys():
    package = Path(dflash_train.__file__).parent
    named = {}
    for path in package.rglob("*.py"):
        for key in named_keys(path.read_text(encoding="utf-8")):
            named.setdefault(key, str(path.relative_to(package)))
    assert "data.chat_template" in named and len(named) > 20  # the scan sees the messages
    bad = {k: where for k, where in named.items()
           if k.split(".")[0] not in SECTIONS or k.split(".")[1] not in SECTIONS[k.split(".")[0]]}
    assert not bad, f"messages name keys that do not exist: {bad}"
