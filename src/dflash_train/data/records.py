"""Chat records as message lists: the one parser of record schemas (pure Python).

A record is an OpenAI ``messages`` list (role/content, content parts, reasoning and tool
calls), a ShareGPT ``conversations`` list (from/value) or a ``prompt``/``response`` pair
with an optional ``system``; training data may also be plain text, a record with a ``text``
field (:func:`record_kind`, :func:`plain_text`: loss on every token). Training data
(:func:`normalize`, via :mod:`.readers`) needs whole conversations; evaluation
(:func:`prompt_messages`) needs the prompt part only.
Every error is a :class:`DataError` naming the record's location and field. No
``datasets`` import here: ``eval`` uses this module on machines without it.
"""

from __future__ import annotations

from .errors import DataError

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "model": "assistant", "bing": "assistant", "function_call": "assistant", "system": "system",
    "tool": "tool", "function": "tool", "function_response": "tool", "observation": "tool",
}


def _chat(raw: object, location: str) -> list[dict] | None:
    """The messages of an OpenAI ``messages`` or ShareGPT ``conversations`` record; None when
    the record has neither (the callers then try their other formats)."""
    if not isinstance(raw, dict):
        raise DataError(location, "<record>", "not_an_object", f"got {type(raw).__name__}")
    if raw.get("messages") is not None:
        return _openai(raw["messages"], location)
    if raw.get("conversations") is not None:
        return _sharegpt(raw["conversations"], location)
    return None


CHAT_FIELDS = ("messages", "conversations", "prompt", "response")


def record_kind(raw: object) -> str:
    """``"text"`` for a plain-text record (a ``text`` field and no chat field), else ``"chat"``
    (whose parser then names whatever is wrong with it)."""
    if isinstance(raw, dict) and "text" in raw and not any(raw.get(f) is not None for f in CHAT_FIELDS):
        return "text"
    return "chat"


def plain_text(raw: dict, location: str) -> str:
    """The text of a plain-text record, or ``DataError`` naming the field."""
    text = _text(raw.get("text"), location, "text")
    if not text.strip():
        raise DataError(location, "text", "empty_text")
    return text


def normalize(raw: object, location: str) -> list[dict]:
    """Turn one raw record into checked ``{"role", "content"}`` messages or raise ``DataError``."""
    messages = _chat(raw, location)
    if messages is None:
        if "prompt" not in raw and "response" not in raw:
            raise DataError(location, "messages", "missing_field", "need messages, conversations, prompt/response or text")
        messages = _prompt_response(raw, location)
    if not messages:
        raise DataError(location, "messages", "empty_conversation")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(location, "messages", "no_assistant_turn")
    return messages



def prompt_messages(raw: object, location: str) -> list[dict]:
    """The prompt of one evaluation record: the conversation up to, and excluding, its last
    assistant turn. Besides the training formats, a bare string or a ``prompt`` without a
    response (a string or a message list) is a user prompt; a top-level ``system`` string
    opens the conversation unless it already starts with a system message."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    messages = _chat(raw, location)
    if messages is None:
        if "prompt" not in raw:
            raise DataError(location, "messages", "missing_field", "no 'messages', 'conversations' or 'prompt' field")
        prompt = raw["prompt"]
        messages = (_openai(prompt, location, "prompt") if isinstance(prompt, list)
                    else [{"role": "user", "content": _text(prompt, location, "prompt")}])
    system = raw.get("system")
    if isinstance(system, str) and system and (not messages or messages[0]["role"] != "system"):
        messages.insert(0, {"role": "system", "content": system})
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last_assistant is not None:
        messages = messages[:last_assistant]
    if not any(m["role"] != "system" for m in messages):
        raise DataError(location, "messages", "empty_prompt", "the prompt part (before the last assistant turn) is empty")
    return messages


def _turns(items: object, location: str, field: str):
    """(``field[i]``, turn) for a list of turn objects; a clear error for anything else."""
    if not isinstance(items, list):
        raise DataError(location, field, "wrong_type", f"expected a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        name = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise DataError(location, name, "wrong_type", "expected an object")
        yield name, item


def _openai(items: object, location: str, field: str = "messages") -> list[dict]:
    out = []
    for name, item in _turns(items, location, field):
        role = _text(item.get("role"), location, f"{name}.role")
        if role not in ROLES:
            raise DataError(location, f"{name}.role", "unknown_role", repr(role))
        msg = {"role": role, "content": _content(item.get("content"), location, f"{name}.content", role)}
        reasoning = item.get("reasoning_content")
        if role == "assistant" and reasoning is not None:
            msg["reasoning_content"] = _text(reasoning, location, f"{name}.reasoning_content")
        if role == "assistant" and isinstance(item.get("tool_calls"), list):
            msg["tool_calls"] = item["tool_calls"]  # rendered by the template as context, not supervised
        out.append(msg)
    return out


def _sharegpt(items: object, location: str) -> list[dict]:
    out = []
    for name, item in _turns(items, location, "conversations"):
        who = _text(item.get("from"), location, f"{name}.from")
        if who not in SHAREGPT_ROLES:
            raise DataError(location, f"{name}.from", "unknown_role", repr(who))
        out.append({"role": SHAREGPT_ROLES[who], "content": _text(item.get("value"), location, f"{name}.value")})
    return out


def _prompt_response(raw: dict, location: str) -> list[dict]:
    prompt = _text(raw.get("prompt"), location, "prompt")
    response = _text(raw.get("response"), location, "response")
    messages = []
    if raw.get("system") is not None:
        messages.append({"role": "system", "content": _text(raw["system"], location, "system")})
    return messages + [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def _text(value: object, location: str, name: str) -> str:
    if value is None:
        raise DataError(location, name, "missing_field")
    if not isinstance(value, str):
        raise DataError(location, name, "wrong_type", f"expected a string, got {type(value).__name__}")
    return value


def _content(value: object, location: str, name: str, role: str) -> str:
    """OpenAI content: a string, a list of ``{"type": "text", "text"}`` parts, or null for tool calls."""
    if value is None and role == "assistant":
        return ""
    if isinstance(value, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    return _text(value, location, name)
