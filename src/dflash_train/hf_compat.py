"""Differences between the transformers 5.x releases we support, in one place."""

from __future__ import annotations

import inspect


def cache_kwarg(model) -> str:
    """The name of the KV-cache argument of ``model.forward``.

    transformers >= 5.2x calls it ``cache``; earlier 5.x releases ``past_key_values``
    and silently ignore an unknown ``cache=`` (the model then runs without a cache).
    """
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"
