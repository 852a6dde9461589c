"""``data inspect``: show one tokenized example with its supervised tokens, plus dataset statistics."""

from __future__ import annotations

import numpy as np

GREEN, RESET = "\x1b[1;32m", "\x1b[0m"


def highlight(tokenizer, ids: list[int], mask: list[int], color: bool) -> str:
    """Supervised runs in green on a terminal, otherwise wrapped in ``[[...]]``."""
    parts, run, supervised = [], [], False
    open_, close = (GREEN, RESET) if color else ("[[", "]]")
    for tok, m in zip(list(ids) + [None], list(mask) + [None]):
        if tok is None or bool(m) != supervised:
            text = tokenizer.decode(run, skip_special_tokens=False) if run else ""
            parts.append(f"{open_}{text}{close}" if supervised and text else text)
            run, supervised = [], bool(m)
        if tok is not None:
            run.append(tok)
    return "".join(parts)


def statistics(lengths: list[int], supervised: list[int], bins: int = 8) -> str:
    lengths_a = np.asarray(lengths)
    total, sup = int(lengths_a.sum()), int(np.sum(supervised))
    lines = [f"examples: {len(lengths_a)}", f"tokens: {total}",
             f"supervised tokens: {sup} ({sup / max(total, 1):.1%})",
             f"length: min {lengths_a.min()}, mean {lengths_a.mean():.1f}, max {lengths_a.max()}",
             "length histogram:"]
    counts, edges = np.histogram(lengths_a, bins=bins)
    width = 40 / max(counts.max(), 1)
    for c, lo, hi in zip(counts, edges[:-1], edges[1:]):
        lines.append(f"  {int(lo):>7}-{int(hi):<7} {int(c):>7} {'#' * int(round(c * width))}".rstrip())
    return "\n".join(lines)


def inspect_dataset(dataset, report, tokenizer, index: int, color: bool) -> str:
    if not 0 <= index < len(dataset):
        raise ValueError(f"--index {index} out of range: the dataset has {len(dataset)} examples")
    row = dataset[index]
    return "\n".join([
        f"=== example {index} ({row['length']} tokens, {row['num_supervised']} supervised) ===",
        highlight(tokenizer, row["input_ids"], row["loss_mask"], color),
        "=== statistics ===",
        statistics(dataset["length"], dataset["num_supervised"]),
        "=== skip report ===",
        report.format(),
    ])
