"""The configuration reference, read from the config dataclasses themselves so it cannot drift.

Every key of a job config is a dataclass field (``config.JobConfig`` and its sections). A key's
meaning is written once, as a comment in the source next to the field: either on the field's own
line (``lr: float = 6e-4  # peak learning rate``) or as a block of comment lines directly above it.
This module finds those comments with ``ast`` (where each field starts and ends) and ``tokenize``
(where the comments are), and renders one Markdown table per section: key, type, default, meaning.
An inherited field's comment is read in the class that defines it (the tracking backends' keys of
``train``: ``tracking/<backend>.py``). A field with no comment shows ``(undocumented)``;
``undocumented_keys()`` lists them.

``docs/config.md`` is this module's output, committed; a test regenerates it and fails when the
dataclasses changed without it. Regenerate with::

    dflash-train config --reference > docs/config.md
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

UNDOCUMENTED = "(undocumented)"
REGENERATE = "dflash-train config --reference > docs/config.md"


@dataclass(frozen=True)
class Key:
    """One configuration key as the reference shows it."""

    name: str  # dotted, as written in an override: ``train.max_steps``
    type: str
    default: str  # as YAML would write it
    help: str  # the source comment, or "" when there is none


# Comments addressed to tools, not readers: never a key's meaning.
PRAGMA = re.compile(r"^(noqa\b|type:|pragma:|fmt:|pyright:|ruff:|mypy:)")


def _comment_lines(source: str) -> tuple[dict[int, str], set[int]]:
    """Each line's comment text (1-based line numbers) and the lines that hold only a comment."""
    comments: dict[int, str] = {}
    only_comment: set[int] = set()
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        text = tok.string.lstrip("#").strip()
        if tok.type != tokenize.COMMENT or PRAGMA.match(text):
            continue
        row = tok.start[0]
        comments[row] = text
        if not lines[row - 1][: tok.start[1]].strip():
            only_comment.add(row)
    return comments, only_comment


def _block_above(row: int, comments: dict[int, str], only_comment: set[int]) -> list[str]:
    """The comment-only lines directly above ``row`` (no blank line between), top to bottom."""
    block = []
    row -= 1
    while row in only_comment:
        block.append(comments[row])
        row -= 1
    return block[::-1]


@cache
def field_comments(cls: type) -> dict[str, str]:
    """``{field name: its comment}`` for the fields of dataclass ``cls`` that have one, each read in
    the class that defines it: an inherited field's meaning is written in its base class's source
    (``config.TrainConfig``'s tracking keys: tracking/wandb.py's ``WandbSettings``, ...). The most
    derived class that annotates a field defines it, as for ``dataclasses``."""
    found: dict[str, str] = {}
    defined: set[str] = set()
    for klass in cls.__mro__:
        own = _own_comments(klass)
        names = set(inspect.get_annotations(klass)) - defined
        found.update({name: own[name] for name in names if name in own})
        defined |= names
    return found


@cache
def _own_comments(cls: type) -> dict[str, str]:
    """The comments of the fields written in ``cls``'s own body (not its bases').

    The block of comment lines directly above a field comes first, then any comment on the
    field's own lines (a field may span several lines); lines join with spaces.
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # made at run time (dataclasses.make_dataclass): no source, no comments
        return {}
    comments, only_comment = _comment_lines(source)
    class_node = ast.parse(source).body[0]
    found = {}
    for node in class_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        parts = _block_above(node.lineno, comments, only_comment)
        parts += [comments[row] for row in range(node.lineno, node.end_lineno + 1)
                  if row in comments and row not in only_comment]
        if parts:
            found[node.target.id] = " ".join(parts)
    return found


def type_name(annotation: Any) -> str:
    """An annotation as the source writes it: strings (``from __future__ import annotations``)
    unchanged; real types in the same ``int | None`` / ``list[str]`` spelling."""
    if isinstance(annotation, str):
        return annotation
    if annotation is type(None):
        return "None"
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " | ".join(type_name(arg) for arg in typing.get_args(annotation))
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return re.sub(r"\btyping\.", "", repr(annotation))


def _plain(value: Any) -> Any:
    """Tuples as lists and nested dataclasses as dicts: what a YAML file holds."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def default_text(value: Any) -> str:
    """A default as a YAML/JSON literal: ``null``, ``true``, ``"adamw"``, ``[0.9, 0.95]``."""
    if value is dataclasses.MISSING:
        return "(required)"
    try:
        return json.dumps(_plain(value))
    except TypeError:  # an object JSON cannot write: its repr is the best we have
        return repr(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def iter_keys(cls: type, prefix: str) -> Iterator[Key]:
    """Every key of dataclass ``cls`` under ``prefix``; a field whose default is itself a dataclass
    is walked into (``prefix.field.key``), whatever its annotation says."""
    helps = field_comments(cls)
    for f in dataclasses.fields(cls):
        default = _default(f)
        name = f"{prefix}.{f.name}"
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            yield from iter_keys(type(default), name)
        else:
            yield Key(name, type_name(f.type), default_text(default), helps.get(f.name, ""))


def sections() -> list[tuple[str, type]]:
    """The job config's sections in file order: ``[("target", TargetConfig), ...]``."""
    from dflash_train.config import JobConfig

    return [(name, type(value)) for name, value in
            ((f.name, _default(f)) for f in dataclasses.fields(JobConfig))]


def all_keys() -> list[Key]:
    return [key for name, cls in sections() for key in iter_keys(cls, name)]


def undocumented_keys() -> list[str]:
    """Dotted keys whose field has no source comment."""
    return [key.name for key in all_keys() if not key.help]


def _rst_to_markdown(text: str) -> str:
    return text.replace("``", "`")


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, even inside code spans)."""
    return text.replace("|", "\\|")


def _prose(text: str) -> str:
    """A comment as table text: also no emphasis, strike-through or HTML from ``*``, ``~``, ``<``."""
    for char in "\\*~<":
        text = text.replace(char, "\\" + char)
    return _cell(text)


# What each section is for, in a user's words; a section without a line here shows its class docstring.
SECTION_INTROS = {
    "target": "The frozen model the drafter learns to predict: a Hugging Face model folder or a `.gguf` file.",
    "drafter": "The drafter's architecture. Keys left `null` are read from the target when training starts "
               "(sizes, RoPE, vocabulary, target layers, mask token); the exported `config.json` holds the "
               "resolved values.",
    "data": "The training conversations and how they are tokenized, filtered, cached and batched.",
    "optim": "The optimizer and its learning-rate schedule (linear warmup, then cosine decay).",
    "train": "The training loop: length, speed features, logging, checkpoints and resuming.",
    "objective": "What the drafter is trained to minimize: how block positions are weighted, what each position "
                 "is trained towards (the label, the target's own distribution), and the drafter kind's own terms.",
}


def section_summary(name: str, cls: type) -> str:
    """The section's line in ``SECTION_INTROS``, else the first paragraph of its class's docstring."""
    if name in SECTION_INTROS:
        return SECTION_INTROS[name]
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclass() writes when there is none
        return ""
    return _rst_to_markdown(" ".join(doc.split("\n\n")[0].split()))


INTRO = """\
# Configuration reference

<!-- Generated from the config dataclasses by `{regenerate}`; do not edit by hand. -->

A job config is a YAML (or JSON) file with these sections: {sections}. A recipe (`cpu-demo`,
`smollm2-1gpu`, ...) is such a file shipped with the package. Any key can be overridden on the
command line as `section.key=value`; the value parses as YAML (`train.max_steps=100`,
`data.paths=[a.jsonl,b.jsonl]`, `objective.gamma=null`; a key inside a mapping as
`drafter.options.selector_top_k=8`). Unknown keys are refused.

`dflash-train config RECIPE_OR_FILE [overrides...]` prints the config a run would use: every key,
after the overrides, validated. Its output is itself a config file.

Defaults below are YAML literals. The meanings are the comments next to the fields in the source
(`src/dflash_train/config.py`, `data/__init__.py`, `models/config.py`; a logging backend's own keys
in its module, `tracking/wandb.py`, `tracking/mlflow.py`).
"""


def section_markdown(name: str, cls: type) -> str:
    lines = [f"## `{name}`", ""]
    summary = section_summary(name, cls)
    if summary:
        lines += [summary, ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key in iter_keys(cls, name):
        meaning = _prose(key.help) if key.help else UNDOCUMENTED
        lines.append(f"| `{key.name}` | `{_cell(key.type)}` | `{_cell(key.default)}` | {meaning} |")
    return "\n".join(lines) + "\n"


def kinds_markdown() -> str:
    """The drafter kinds' table, from their registries: what ``drafter.kind`` takes, and each kind's
    ``drafter.options`` and ``objective.kind`` settings with their defaults."""
    import json

    from dflash_train.models.kinds import get_kind, kind_names
    from dflash_train.objective.kinds import terms_of

    def settings(values: dict) -> str:
        return ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in values.items()) or "none"

    lines = ["## Drafter kinds", "",
             "What `drafter.kind` takes (each kind's network is `models/kinds/<kind>.py`, its training terms "
             "`objective/kinds/<kind>.py`, its decoder's chooser `decoding/choosers/<kind>.py`), and its settings "
             "with their defaults.", "",
             "| kind | served as | `drafter.options` | `objective.kind` |", "|---|---|---|---|"]
    for name in kind_names():
        kind = get_kind(name)
        lines.append(f"| {name} | `{kind.architecture}` | {settings(kind.options)} | "
                     f"{settings(terms_of(name).options)} |")
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """The whole reference (``docs/config.md``)."""
    names = ", ".join(f"`{name}`" for name, _ in sections())
    parts = [INTRO.format(regenerate=REGENERATE, sections=names)]
    parts += [section_markdown(name, cls) for name, cls in sections()]
    parts.append(kinds_markdown())
    return "\n".join(parts)


def keys_epilog(width: int = 100) -> str:
    """A short list of every section's keys for ``--help`` (use with
    ``argparse.RawDescriptionHelpFormatter`` so the lines are kept)."""
    lines = ["config keys (override any as section.key=value; their types, defaults and meanings:",
             "dflash-train config --reference):"]
    for name, cls in sections():
        keys = ", ".join(key.name[len(name) + 1:] for key in iter_keys(cls, name))
        lines += textwrap.wrap(keys, width=width, initial_indent=f"  {name}: ",
                               subsequent_indent=" " * (len(name) + 4), break_on_hyphens=False,
                               break_long_words=False)
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")
