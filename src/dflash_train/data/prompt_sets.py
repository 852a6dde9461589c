"""Prompt sets known by name, so a config can say ``eval.prompts: heldout``.

A named set is a prompt file that ships inside the package. The trainer resolves a name
here, without importing the recipes that wrote the file; the recipes ask here too (the
prompt synthesizer keeps every held-out prompt out of the training data), so both sides
agree on one file.

``heldout``: general questions and instructions written by hand for this project, one
per line, never trained on (``recipes/heldout_prompts.txt``): what results are reported on.

``selection``: 96 more, written the same way and never trained on either
(``recipes/selection_prompts.txt``), for choosing between ablations. Choosing on the prompts
a result is then reported on would fit the choice to them; the held-out set's last 16 prompts
served for that before, and 16 prompts cannot tell apart the +-0.03 differences ablations give.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

# name -> the file's place inside the ``dflash_train`` package
NAMED_PROMPT_SETS = {"heldout": "recipes/heldout_prompts.txt", "selection": "recipes/selection_prompts.txt"}
# the sets no training data may contain (the prompt synthesizer refuses their prompts)
NEVER_TRAINED = ("heldout", "selection")


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
