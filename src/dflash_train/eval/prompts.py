"""Evaluation prompts: chat JSONL/JSON files or plain text (one prompt per line).

Chat records may use OpenAI ``messages`` (role/content), ShareGPT ``conversations``
(from/value) or a ``prompt`` field (a string or a message list). The prompt is the
conversation up to, and excluding, its last assistant turn.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "model": "assistant", "bing": "assistant", "system": "system", "tool": "tool", "function": "tool",
    "observation": "tool", "function_call": "assistant",
}


def _message(raw, where: str) -> dict:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a message must be an object, got {type(raw).__name__}")
    if "role" in raw:
        role, content = raw["role"], raw.get("content")
    elif "from" in raw:
        role = SHAREGPT_ROLES.get(str(raw["from"]).lower())
        if role is None:
            raise ValueError(f"{where}: unknown ShareGPT speaker {raw['from']!r}")
        content = raw.get("value")
    else:
        raise ValueError(f"{where}: a message needs 'role'/'content' or 'from'/'value'")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise ValueError(f"{where}: message content must be text")
    return {"role": role, "content": content}


def record_prompt(record, where: str) -> list[dict]:
    """The prompt messages of one chat record."""
    if isinstance(record, str):
        return [{"role": "user", "content": record}]
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object, got {type(record).__name__}")
    if "messages" in record:
        raw = record["messages"]
    elif "conversations" in record:
        raw = record["conversations"]
    elif "prompt" in record:
        raw = record["prompt"]
        if isinstance(raw, str):
            raw = [{"role": "user", "content": raw}]
    else:
        raise ValueError(f"{where}: no 'messages', 'conversations' or 'prompt' field")
    if not isinstance(raw, list):
        raise ValueError(f"{where}: the conversation must be a list of messages")
    messages = [_message(m, where) for m in raw]
    system = record.get("system")
    if isinstance(system, str) and system and (not messages or messages[0]["role"] != "system"):
        messages.insert(0, {"role": "system", "content": system})
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last_assistant is not None:
        messages = messages[:last_assistant]
    if not any(m["role"] != "system" for m in messages):
        raise ValueError(f"{where}: the prompt part (before the last assistant turn) is empty")
    return messages


def read_prompts(path: str | os.PathLike, limit: int | None = None) -> list[list[dict]]:
    """Prompts as message lists from ``.jsonl``/``.json`` chat files or a plain text file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({err.reason} at byte {err.start}); "
                         f"save the prompts file as UTF-8") from None
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
