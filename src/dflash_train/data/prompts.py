"""Evaluation prompts: chat JSONL/JSON files or plain text (one prompt per line).

Chat records are parsed by :func:`dflash_train.data.records.prompt_messages`, the same
record schemas and role table as training data: OpenAI ``messages``, ShareGPT
``conversations``, or a ``prompt`` (a string or a message list, with or without a
response). The prompt is the conversation up to, and excluding, its last assistant turn.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dflash_train.data.records import prompt_messages
from dflash_train.files import explained


def record_prompt(record, where: str) -> list[dict]:
    """The prompt messages of one chat record (the data readers' schemas and role table)."""
    return prompt_messages(record, where)


def read_prompts(path: str | os.PathLike, limit: int | None = None) -> list[list[dict]]:
    """Prompts as message lists from ``.jsonl``/``.json`` chat files or a plain text file;
    ``limit``: the first N prompts (None: all; 0 or less is refused, not read as "all")."""
    if limit is not None and limit < 1:
        raise ValueError(f"prompt limit must be >= 1 (or none for all prompts), got {limit}")
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"prompts file not found: {path}")
    try:
        return _parse_prompts(path, _read_text(path), limit)
    except RecursionError:
        raise ValueError(f"{path}: malformed JSON (nested too deeply)") from None


def _read_text(path: Path) -> str:
    """The file's UTF-8 text, or one line: unreadable (a dangling link, a loop, a folder, an
    I/O error) or not UTF-8 (``file:line``)."""
    with explained("cannot read prompts", path):
        data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        hint = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise ValueError(f"{path}:{line}: not UTF-8 text{hint} ({err.reason} at byte {err.start}); "
                         f"save the prompts file as UTF-8") from None


def _parse_prompts(path: Path, text: str, limit: int | None) -> list[list[dict]]:
    out: list[list[dict]] = []
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({err})") from None
            out.append(record_prompt(record, f"{path}:{lineno}"))
            if limit and len(out) >= limit:
                break
    elif path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: malformed JSON ({err})") from None
        records = data if isinstance(data, list) else [data]
        for n, record in enumerate(records[:limit] if limit else records, 1):
            out.append(record_prompt(record, f"{path}:{n}"))
    else:
        for line in text.splitlines():
            if line.strip():
                out.append([{"role": "user", "content": line.strip()}])
            if limit and len(out) >= limit:
                break
    if not out:
        raise ValueError(f"{path}: no prompts found")
    return out


def encode_prompts(tokenizer, prompts: list[list[dict]]) -> list[list[int]]:
    """Token ids with the tokenizer's chat template (``add_generation_prompt=True``);
    without a template, the contents joined by newlines."""
    ids = []
    for messages in prompts:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            ids.append(tokenizer("\n".join(m["content"] for m in messages))["input_ids"])
    return ids
