"""The drafter kinds beyond DFlash, one network file each, found and registered on import.

Each module here defines a :class:`~dflash_train.models.drafter.DrafterKind` and registers it
(``register_kind``); this package imports every module in the folder, so a new kind is a new
file, with no list to edit. The kinds' training terms live in ``objective/kinds/`` and their
decoders' choosers in ``decoding/choosers/``, registered the same way by the kind's name.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib import resources

from dflash_train.models.drafter import KINDS, DrafterKind

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def kind_names() -> list[str]:
    """Every registered kind's name, DFlash first."""
    return ["dflash", *sorted(k for k in KINDS if k != "dflash")]


def get_kind(name: str) -> DrafterKind:
    """The kind registered as ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in KINDS:
        raise ValueError(f"drafter.kind must be one of {kind_names()}, got {name!r}")
    return KINDS[name]


def kind_source(name: str) -> str | None:
    """The network file of kind ``name`` (None for DFlash, whose network is the backbone alone)."""
    if name == "dflash":
        return None
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
