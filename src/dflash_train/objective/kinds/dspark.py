"""DSpark's training terms: the Markov head's logit bias and the confidence head's BCE.

- The Markov bias ``W2 W1[prev]`` joins each row's logits inside the chunked loss (as the pair
  ``(W1[prev] [n, r], W2 [V, r])``, so the [n, V] bias exists one chunk at a time and its
  gradients reach both matrices), with ``prev`` teacher-forced: the label before (slot 1: the
  anchor), as the decoder's walk sees it when every earlier slot was accepted. Every target and
  weighting then applies to the biased logits; ``correct`` is the biased argmax, what the walk
  emits given a correct prefix.
- The confidence head predicts, per row, whether that draft is right given its prefix was:
  ``BCE(sigmoid(proj([h ; W1[prev]])), argmax == label)``, weighted by the weights the loss used
  times ``confidence_weight`` (``objective.kind``, default 1.0). Its target is detached: the head
  learns to read the drafter, not to move it.

DSpark's published objective adds total variation to the target's distribution:
``objective.targets: {ce: 0.1, tv: 0.9}`` (NeMo's guide); the recipe default stays ``{ce: 1}``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_train.objective.kinds import KindLoss, KindTerms, register_terms


def _heads(drafter):
    """(markov_head, confidence_head or None), through a DDP or compile wrapper."""
    core = getattr(drafter, "module", drafter)
    return core.markov_head, getattr(core, "confidence_head", None)


class DSparkTerms(KindTerms):
    name = "dspark"
    options = {"confidence_weight": 1.0}

    def check_options(self, options):
        super().check_options(options)
        weight = options.get("confidence_weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight >= 0:
            raise ValueError(f"objective.kind.confidence_weight must be a number >= 0, got {weight!r}")

    def logit_bias(self, drafter, inputs):
        markov, _ = _heads(drafter)
        return markov.embed(inputs.prev), markov.markov_w2.weight

    def terms(self, drafter, inputs, chunk, options):
        markov, confidence = _heads(drafter)
        if confidence is None or not options["confidence_weight"]:
            return None
        logits = confidence(inputs.hidden, markov.embed(inputs.prev))
        right = (chunk.argmax == inputs.labels).float()
        bce = F.binary_cross_entropy_with_logits(logits, right, reduction="none")
        total = (bce * chunk.used).sum() * float(options["confidence_weight"])
        with torch.no_grad():
            agree = (((logits > 0).float() == right).float() * inputs.valid).sum() / inputs.valid.sum().clamp(min=1)
        return KindLoss(total, None, {"confidence_bce": total.detach(), "confidence_accuracy": agree})


register_terms(DSparkTerms())
