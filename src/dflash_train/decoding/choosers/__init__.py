"""How each drafter kind turns a block's states into drafts, one file per kind, by kind name.

A chooser is a :class:`~dflash_train.decoding.core.BlockChooser`: from the draft slots' final
states, their logits through the target's lm_head and the verified anchor, it returns the
:class:`~dflash_train.decoding.core.Proposal` (the drafts, and when sampling the distribution
each was drawn from, which the rejection rule needs). DFlash's (:func:`choose_independently`,
in ``core``) takes every slot on its own; a kind whose drafts depend on each other (DFlash2's
selector walk) registers its own here. Every module in this folder
registers on import: a new kind's chooser is a new file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

CHOOSERS: dict[str, Callable] = {}  # kind name -> factory(drafter) -> BlockChooser


def register_chooser(kind_name: str):
    """Decorator: ``factory(drafter)`` makes the chooser of drafters of kind ``kind_name``."""
    def register(factory):
        CHOOSERS[kind_name] = factory
        return factory
    return register


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
