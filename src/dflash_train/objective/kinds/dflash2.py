"""DFlash2's training terms (docs/spec.md section 2b): the selector's cross-entropy.

The chunked loss returns each row's top-k candidates of the drafter's logits; the selector then
scores them given the predecessor (teacher-forced: the label before; slot 1: the anchor) and is
trained to put the label first (:func:`selector_ce`). ``correct`` for the metrics becomes the
selector's greedy pick, which is what decoding emits. Setting (``objective.kind``):
``selector_out_of_topk``: ``inject`` (default) or ``exclude``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from dflash_train.objective.kinds import KindLoss, KindTerms, register_terms

OUT_OF_TOPK = ("inject", "exclude")  # objective.kind.selector_out_of_topk's choices, the default first


def _selector_scores(selector, hidden, lm_head, candidates, predecessors):
    """S over the candidates of a chunk of rows; U is the drafter's logit of each candidate, built
    from the k lm_head rows only (its gradient reaches the drafter through ``hidden``)."""
    unary = torch.einsum("nh,nkh->nk", hidden.to(lm_head.dtype), lm_head[candidates]).float()
    return selector.scores(selector.hidden_projection(hidden), unary, candidates, predecessors).float()


def selector_ce(selector, hidden, lm_head, labels, predecessors, candidates, weights, out_of_topk=OUT_OF_TOPK[0],
                chunk_size=4096):
    """DFlash2's selector loss: ``sum_i w_i * CE(S_i, index of label_i among the candidates)``, and
    each row's greedy pick, with the predecessor teacher-forced (the label before; slot 1: the anchor).

    ``candidates`` [n, k] come from the drafter's logits, best first (``chunked_ce_parts``).
    A label outside its top-k: ``out_of_topk="inject"`` (the default, as SpecForge and speculators)
    puts the label in the last (lowest-logit) slot; "exclude" (NeMo) drops the row from this term.
    The case for exclude: decoding only ever ranks the top-k of the drafter's own logits, so an
    injected label trains S on candidate sets the walk never sees. The case for inject: a row whose
    label missed the top-k (most rows at late block positions early in training) still teaches the
    selector's codebooks, and S's unary part, the label's own logit, gets the selector's gradient
    too. Measured (SmolLM2 recipe, one H200, 1.1 minutes each, replayed on the 40 held-out prompts;
    docs/results, 2026-12-04): inject beat exclude by +0.044 +- 0.016 tau on prompts 1-24 (16/24)
    and +0.027 +- 0.016 on all 40, so it is the default. Chunks run under checkpointing: the
    gathered [chunk, k, h] lm_head rows exist one chunk at a time, in backward too.
    """
    if out_of_topk not in OUT_OF_TOPK:
        raise ValueError(f"objective.kind.selector_out_of_topk must be one of {list(OUT_OF_TOPK)}, got {out_of_topk!r}")
    hit = candidates == labels.unsqueeze(-1)
    present = hit.any(-1)
    if out_of_topk == "inject":
        candidates = candidates.clone()
        candidates[:, -1] = torch.where(present, candidates[:, -1], labels)
        hit = candidates == labels.unsqueeze(-1)
        row_weights = weights
    else:
        row_weights = weights * present
    target = hit.long().argmax(-1)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    picks = []
    for start in range(0, hidden.shape[0], chunk_size):
        part = slice(start, start + chunk_size)
        scores = checkpoint(_selector_scores, selector, hidden[part], lm_head, candidates[part], predecessors[part],
                            use_reentrant=False)
        ce = F.cross_entropy(scores, target[part], reduction="none")
        total = total + (ce * row_weights[part]).sum()
        picks.append(candidates[part].gather(1, scores.detach().argmax(-1, keepdim=True)).squeeze(1))
    picks = torch.cat(picks)
    return total, torch.where(present, picks, torch.full_like(picks, -1))


class DFlash2Terms(KindTerms):
    name = "dflash2"
    options = {"selector_out_of_topk": OUT_OF_TOPK[0]}

    def check_options(self, options):
        super().check_options(options)
        choice = options.get("selector_out_of_topk", OUT_OF_TOPK[0])
        if choice not in OUT_OF_TOPK:
            raise ValueError(f"objective.kind.selector_out_of_topk must be one of {list(OUT_OF_TOPK)}, got {choice!r}")

    def top_k(self, drafter) -> int:
        return _selector(drafter).top_k

    def terms(self, drafter, inputs, chunk, options):
        total, picks = selector_ce(_selector(drafter), inputs.hidden, inputs.lm_head, inputs.labels, inputs.prev,
                                   chunk.candidates, chunk.used, options["selector_out_of_topk"], inputs.chunk_size)
        return KindLoss(total, picks, {"selector_ce": total.detach()})


def _selector(drafter):
    """The candidate selector, through a DDP or compile wrapper."""
    return getattr(drafter, "module", drafter).candidate_selector


register_terms(DFlash2Terms())
