"""The drafter network, its kinds, the frozen target and their configs (no training code)."""

from dflash_train.models import kinds  # noqa: F401  (registers every drafter kind before any config names one)
