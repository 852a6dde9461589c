"""Tau from a report's per-prompt results, counted one way everywhere (``decoding/core.py``).

Tau is tokens committed per target verify step. Reports written since 2026-12-05 carry each
step's kept tokens (``kept_lengths``); older ones carry each step's acceptance as verified
(``acceptance_lengths``, cut drafts included) and the prompt's ``new_tokens``. For those the
count is recovered exactly: every new token but the prefill's was committed by some step, so
kept tokens = ``new_tokens - 1`` over ``len(acceptance_lengths)`` steps. A result with neither
cannot be recounted; :func:`kept_and_steps` says so (None) rather than guess.

The counting itself is :func:`dflash_train.decoding.core.tally`'s :class:`~dflash_train.decoding.core.Tally`
(the one every engine's steps pass through); this module only reads a report's entries into it.
"""

from __future__ import annotations

from dflash_train.decoding.core import Tally

_NAN = float("nan")


def kept_and_steps(entry: dict) -> tuple[float, int] | None:
    """(tokens committed by verify steps, verify steps) of one prompt's result, or None when
    the result holds neither ``kept_lengths`` nor ``new_tokens`` beside ``acceptance_lengths``."""
    if isinstance(entry.get("kept_lengths"), list):
        return sum(entry["kept_lengths"]), len(entry["kept_lengths"])
    steps = len(entry.get("acceptance_lengths") or [])
    new = entry.get("new_tokens")
    if not isinstance(new, int):
        return None
    return (max(0, new - 1), steps) if steps else (0, 0)


def _counts(entry: dict) -> tuple[float, int]:
    counted = kept_and_steps(entry)
    if counted is None:
        raise ValueError("a per-prompt result without 'kept_lengths' or 'new_tokens': its tau cannot be counted "
                         "on kept tokens")
    return counted


def entries_tally(prompts: list[dict]) -> Tally:
    """A report's per-prompt results as the one :class:`Tally` (kept tokens and steps per prompt;
    the acceptance as verified where the entries carry it)."""
    counts = [_counts(p) for p in prompts]
    return Tally(kept=[k for k, _ in counts], steps=[s for _, s in counts],
                 verified=[t for p in prompts for t in p.get("acceptance_lengths") or []])


def prompt_tau(entry: dict) -> float:
    """One prompt's tau on kept tokens (0 when it ended at the prefill)."""
    return entries_tally([entry]).tau()


def pooled_tau(prompts: list[dict]) -> float:
    """Tau pooled over every verify step of these prompts (a report's ``mean_tau``)."""
    return entries_tally(prompts).tau(_NAN)


def per_prompt_tau(prompts: list[dict]) -> float:
    """The mean of the prompts' own taus (prompts with at least one verify step)."""
    return entries_tally(prompts).per_prompt_tau(_NAN)


def verified_tau(prompts: list[dict]) -> float:
    """Acceptance per step as verified, cut drafts included: how tau was counted before 2026-12-05."""
    return Tally(verified=[t for p in prompts for t in p["acceptance_lengths"]]).verified_tau(_NAN)
