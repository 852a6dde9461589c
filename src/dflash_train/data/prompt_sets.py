"""Prompt sets known by name, so a config can say ``eval.prompts: heldout``.

A named set is a prompt file that ships inside the package. The trainer resolves a name
here, without importing the recipes that wrote the file; the recipes ask here too (the
prompt synthesizer keeps every held-out prompt out of the training data), so both sides
agree on one file.

``heldout``: general questions and instructions written by hand for this project, one
per line, never trained on (``recipes/heldout_prompts.txt``).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

# name -> the file's place inside the ``dflash_train`` package
NAMED_PROMPT_SETS = {"heldout": "recipes/heldout_prompts.txt"}


def prompt_set_path(name: str) -> Path:
    """The packaged file of a named prompt set."""
    if name not in NAMED_PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; known: {', '.join(sorted(NAMED_PROMPT_SETS))}")
    return Path(str(resources.files("dflash_train").joinpath(*NAMED_PROMPT_SETS[name].split("/"))))


def resolve_prompts(value: str | os.PathLike) -> Path:
    """A prompts setting as a file: a named set's packaged file, else the path itself."""
    if isinstance(value, str) and value in NAMED_PROMPT_SETS:
        return prompt_set_path(value)
    return Path(value)
