"""The chat template a run formats conversations with: the tokenizer's own, or ``data.chat_template``.

Base models often ship no template, and some ship one that does not match how their data
was written. ``data.chat_template`` takes either a Jinja template string or the path of a
``.jinja`` file; :func:`use_chat_template` installs it on the tokenizer object itself, so
every later use of that tokenizer formats chats the same way: the training data (and its
cache key, which hashes the template), held-out evaluation during training, ``data
inspect``, and evaluation, which calls it on the target's tokenizer before encoding prompts.
"""

from __future__ import annotations

from pathlib import Path


def looks_like_template(value: str) -> bool:
    """Jinja text rather than a file name: it has a tag or an expression."""
    return "{%" in value or "{{" in value


def read_chat_template(value: str | None) -> str | None:
    """The template text ``value`` gives (None: keep the tokenizer's). One clear line when a path
    is given that cannot be read."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"data.chat_template: expected a Jinja template string or the path of a .jinja file, got {value!r}")
    if looks_like_template(value):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"data.chat_template: {value!r} is neither a Jinja template (no {{% %}} or {{{{ }}}} in it) nor an "
                         "existing file; give the template text or the path of a .jinja file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"data.chat_template: cannot read {path}: {err}") from None
    if not looks_like_template(text):
        raise ValueError(f"data.chat_template: {path} holds no Jinja template (no {{% %}} or {{{{ }}}} in it)")
    return text


def use_chat_template(tokenizer, value: str | None):
    """Install ``value`` (template text or a .jinja path; None: no change) on ``tokenizer`` and
    return it. Eval calls this on the target's tokenizer with the same setting as training."""
    text = read_chat_template(value)
    if text is not None and tokenizer is not None:
        tokenizer.chat_template = text
    return tokenizer


def missing_template_message(tokenizer) -> str:
    """What to do when chat records meet a tokenizer without a template (names existing keys only)."""
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    return (f"tokenizer {name!r} has no chat template, so chat records cannot be split into turns: set "
            f"data.chat_template (a Jinja template string or a .jinja file), use a chat/instruct model's tokenizer, "
            'or train on plain text records ({"text": ...}: loss on every token)')
