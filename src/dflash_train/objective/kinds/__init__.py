"""The training terms each drafter kind adds to the objective, one file per kind, by kind name.

The shared objective (``objective/loss.py``) computes the weighted, chunked loss of every block
position through the target's lm_head. A kind may add to it (:class:`KindTerms`):

- a low-rank bias on the logits, trainable, inside the chunked loss (e.g. a head that conditions
  each slot on the token before it);
- candidates: each row's top-k ids from the chunk's logits (DFlash2's selector scores them);
- terms of its own, computed after the chunked loss from the drafter's states and the chunk's
  outputs (DFlash2's selector cross-entropy), which may also say what
  "the draft was right" means for the metrics (the selector's pick rather than the argmax).

A kind's settings here are ``objective.kind`` (e.g. ``{selector_out_of_topk: exclude}``). Every
module in this folder registers its entry on import, so a new kind is a new file; a kind with no
file (DFlash) gets :class:`KindTerms` itself: nothing added.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

import torch


@dataclass
class TermInputs:
    """What a kind's terms see: the flattened draft slots' final states ``hidden`` [n, h], their
    ``labels`` and ``prev`` (the label before each, teacher-forced; the block's anchor for slot 1)
    [n], ``valid`` [n] bool, the frozen ``lm_head`` [V, h], and the loss's chunk size."""

    hidden: torch.Tensor
    labels: torch.Tensor
    prev: torch.Tensor
    valid: torch.Tensor
    lm_head: torch.Tensor
    chunk_size: int


@dataclass
class ChunkOutputs:
    """What the chunked loss gives back per row: ``argmax`` [n] (of the biased logits), the weights
    it ``used`` [n] (detached) and ``candidates`` [n, k] (empty unless the kind asked for top-k)."""

    argmax: torch.Tensor
    used: torch.Tensor
    candidates: torch.Tensor


@dataclass
class KindLoss:
    """A kind's own terms: their weighted sum (added to the loss), the draft each row would emit
    (None: the argmax), and device scalars to log by name."""

    total: torch.Tensor
    picks: torch.Tensor | None = None
    logs: dict | None = None


class KindTerms:
    """DFlash's entry (nothing added); a kind's entry overrides what it adds. ``options``: its
    settings under ``objective.kind`` and their defaults."""

    name = "dflash"
    options: dict = {}

    def check_options(self, options: dict) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"objective.kind: {unknown} are not settings of drafter.kind={self.name}'s terms "
                             f"(its settings: {', '.join(sorted(self.options)) or 'none'})")

    def logit_bias(self, drafter, inputs: TermInputs):
        """``(bias_in [n, r], bias_head [V, r])``: the chunked loss adds ``bias_in @ bias_head.T`` to the
        logits (both may require grad); None: no bias."""
        return None

    def top_k(self, drafter) -> int:
        """How many candidate ids per row the chunked loss should return (0: none)."""
        return 0

    def terms(self, drafter, inputs: TermInputs, chunk: ChunkOutputs, options: dict) -> KindLoss | None:
        """The kind's own terms (None: none)."""
        return None


TERMS: dict[str, KindTerms] = {"dflash": KindTerms()}


def register_terms(terms: KindTerms) -> KindTerms:
    TERMS[terms.name] = terms
    return terms


def terms_of(kind_name: str) -> KindTerms:
    """The training terms of a drafter kind (DFlash's, adding nothing, for a kind with no file here)."""
    return TERMS.get(kind_name, TERMS["dflash"])


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
