"""Trimming answers that end in a repetition loop (``data.trim_loops``).

Greedy answers of a small model often end in a loop: the same phrase repeated until the
generation length cap (about a third of SmolLM2-135M's greedy answers of <= 320 tokens).
Once a loop has started every next token is a copy of the token one period back, so a
drafter predicts it trivially: such anchors inflate the training accuracy and spend
compute teaching nothing new. Trimming keeps the first two periods of the loop (the
drafter still learns that a loop, once started, continues) and drops the rest.

A trailing loop is a suffix ``tokens[start:]`` with ``tokens[i] == tokens[i + period]``
throughout, for a period of 1..``MAX_PERIOD`` tokens. It must span at least
``MIN_REPEATS`` periods and ``MIN_LOOP_TOKENS`` tokens: a phrase said twice, a short run
of ``=`` or a refrain is ordinary text; three back-to-back identical copies covering two
16-token drafter blocks are not. The last ``SLACK`` tokens may break the pattern: the
answer was cut at the length cap, possibly inside a word, which then re-tokenizes
differently.
"""

from __future__ import annotations

MAX_PERIOD = 64
MIN_REPEATS = 3
MIN_LOOP_TOKENS = 32
KEEP_REPEATS = 2
SLACK = 2


def _periodic_start(tokens: list[int], period: int) -> int:
    """The smallest ``start`` such that ``tokens[start:]`` has this period."""
    i = len(tokens) - period - 1
    while i >= 0 and tokens[i] == tokens[i + period]:
        i -= 1
    return i + 1


def trailing_loop(tokens: list[int]) -> tuple[int, int] | None:
    """``(start, period)`` of the loop that ends ``tokens``, or None.

    Of all qualifying periods the one whose cut (``start + KEEP_REPEATS * period``)
    comes first wins, smaller period on ties: a loop of period p also repeats with
    period 2p, and keeping two periods of the short one removes the most.
    """
    best = None
    for slack in range(SLACK + 1):
        body = tokens[: len(tokens) - slack]
        for period in range(1, min(MAX_PERIOD, len(body) // MIN_REPEATS) + 1):
            start = _periodic_start(body, period)
            span = len(body) - start
            if span < max(MIN_REPEATS * period, MIN_LOOP_TOKENS):
                continue
            cut = start + KEEP_REPEATS * period
            if best is None or cut < best[0] + KEEP_REPEATS * best[1]:
                best = (start, period)
        if best is not None:
            return best
    return None


def loop_cut(tokens: list[int]) -> int | None:
    """Index from which ``tokens`` is dropped (two loop periods kept), or None: no loop."""
    found = trailing_loop(tokens)
    return None if found is None else found[0] + KEEP_REPEATS * found[1]


def trim_looping_tails(ids: list[int], mask: list[int], segments: list[list[int]],
                       specials: set[int]) -> tuple[list[int], list[int], int, int]:
    """Trim every supervised segment (one assistant turn's token positions) that ends in a loop.

    The last supervised segment's tail is removed from the row (with what follows it:
    only unsupervised template tokens), so packing fits more conversations per row; an
    earlier turn's tail stays as context with its loss mask set to 0. A segment's
    closing end-of-turn token goes with the tail: after a loop cut at the length cap it
    is an artifact of the cut, not something the model would say.
    Returns ``(ids, mask, tails trimmed, supervised tokens removed)``.
    """
    ids, mask = list(ids), list(mask)
    tails = removed = 0
    for seg in reversed(segments):  # back to front: cutting the row keeps earlier positions valid
        seg = [t for t in seg if t < len(ids)]
        body = seg[:-1] if seg and ids[seg[-1]] in specials else seg
        cut = loop_cut([ids[t] for t in body])
        if cut is None:
            continue
        dropped = seg[cut:]
        tails += 1
        removed += sum(mask[t] for t in dropped)
        if not any(mask[seg[-1] + 1:]):
            del ids[dropped[0]:], mask[dropped[0]:]
        else:
            for t in dropped:
                mask[t] = 0
    return ids, mask, tails, removed
