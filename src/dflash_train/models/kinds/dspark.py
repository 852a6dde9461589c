"""DSpark: the DFlash backbone plus a semi-autoregressive Markov head and a confidence head
(arXiv 2607.05147). Its network, shipped after ``models/drafter.py`` in a DSpark export (the
import line below is dropped there: both files then form one module); training terms in
``objective/kinds/dspark.py``, the decoder's chooser in ``decoding/choosers/dspark.py``.

A DFlash block drafts its slots independently: slot k's token never sees slot k - 1's. The
Markov head adds, to slot k's logits, a low-rank bias that depends on the token before it:
``logits_k + W2 W1[prev_k]`` (``markov_head.markov_w1``: an embedding [vocab, r];
``markov_w2``: r -> vocab), so the block is drafted left to right (:func:`markov_walk`), each
slot conditioned on the previous slot's pick, at the price of one small product per slot
instead of a second drafter pass. Training teacher-forces ``prev_k`` with the label before.

The optional confidence head predicts whether slot k's draft will be accepted given the slots
before it were: ``sigmoid(proj([h_k ; W1[prev_k]]))`` over the slot's final state and the
previous token's Markov embedding; an engine may stop a block early where it is low
(llama.cpp: ``--spec-draft-p-min``).

Block layout: the DFlash one. The block is ``[anchor, MASK x (B - 1)]`` and slots 1 .. B - 1
draft the B - 1 tokens after the verified anchor, whose token is slot 1's ``prev`` (the "1 + N"
layout with the anchor as a bonus slot: ``sample_from_anchor: false`` in the serving config).
``markov_w2`` starts at zero, so an untrained DSpark drafts exactly what DFlash drafts.
Options: ``markov_rank`` (r, default 256), ``confidence_head`` (default true).
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_train.models.drafter import DrafterKind, KindModule, _cfg, register_kind  # backbone


class MarkovHead(KindModule):
    """``bias(prev) = markov_w2(markov_w1(prev))``: a rank-r bias on the logits from the token before."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W1 as an embedding (unit normal rows), W2 zero: no bias until trained (DSpark = DFlash)."""
        with torch.no_grad():
            nn.init.normal_(self.markov_w1.weight, std=1.0)
            self.markov_w2.weight.zero_()

    def embed(self, prev: torch.Tensor) -> torch.Tensor:
        """The previous tokens' Markov embeddings [..., r]."""
        return self.markov_w1(prev)

    def bias(self, embedded: torch.Tensor) -> torch.Tensor:
        """The logit bias [..., vocab] of embedded previous tokens, in float32."""
        return self.markov_w2(embedded.to(self.markov_w2.weight.dtype)).float()


class ConfidenceHead(KindModule):
    """``proj([h ; W1[prev]])``: one logit per slot that its draft is accepted (given the slots before were)."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1, bias=True)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            nn.init.normal_(self.proj.weight, std=0.02)
            self.proj.bias.zero_()

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """Acceptance logits [...] of slot states ``hidden`` [..., h] and previous-token embeddings [..., r]."""
        features = torch.cat([hidden, embedded.to(hidden.dtype)], dim=-1)
        return self.proj(features.to(self.proj.weight.dtype)).squeeze(-1).float()


def markov_walk(markov: MarkovHead, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float = 0.0,
                generator=None):
    """DSpark's block, slot by slot: slot j's distribution is ``logits[:, j] + bias(prev_j)`` with
    ``prev_0`` the anchor and ``prev_j`` the token picked at slot j - 1 (argmax when greedy, a draw
    from the softmax at ``temperature`` otherwise).

    ``logits`` [b, P, vocab] (float, the slots' base logits through the target's lm_head),
    ``anchor_ids`` [b]. Returns ``(path [b, P], biased logits [b, P, vocab], q [b, P, vocab] or
    None)``: q is each slot's sampling distribution (the rejection rule's). Greedy is pure tensor
    code (the static engine calls it inside a CUDA graph)."""
    prev, picks, rows, q_rows = anchor_ids.reshape(-1), [], [], []
    for slot in range(logits.shape[1]):
        row = logits[:, slot].float() + markov.bias(markov.embed(prev))
        if temperature > 0:
            q = torch.softmax(row / temperature, dim=-1)
            prev = torch.multinomial(q, 1, generator=generator)[:, 0]
            q_rows.append(q)
        else:
            prev = row.argmax(-1)
        picks.append(prev)
        rows.append(row)
    q_out = torch.stack(q_rows, dim=1) if q_rows else None
    return torch.stack(picks, dim=1), torch.stack(rows, dim=1), q_out


class DSparkKind(DrafterKind):
    name = "dspark"
    architecture = "DSparkDraftModel"
    options = {"markov_rank": 256, "confidence_head": True}

    def heads(self, config):
        rank, hidden = int(self.option(config, "markov_rank")), int(_cfg(config, "hidden_size"))
        heads = {"markov_head": MarkovHead(int(_cfg(config, "vocab_size")), rank)}
        if self.option(config, "confidence_head"):
            heads["confidence_head"] = ConfidenceHead(hidden, rank)
        return heads

    def greedy_draft(self, drafter, hidden, logits, anchor_ids):
        """The Markov chain's greedy path from the anchor."""
        return markov_walk(drafter.markov_head, logits, anchor_ids)[0]

    def serving_fields(self, config):
        """What engines read: the rank and head type at the top level (vLLM, SGLang, llama.cpp's
        converter), the 1 + N block layout (``sample_from_anchor: false``), and the same in
        ``dspark_config``. The confidence head under both spellings: ``has_confidence_head``
        (llama.cpp's converter, ours) and ``enable_confidence_head`` with
        ``confidence_head_with_markov: true`` (vLLM 0.32's ``qwen3_dspark.py``, which builds the head
        only when it reads them, and drops its weights otherwise; ours reads ``[h ; W1[prev]]``)."""
        rank = int(self.option(config, "markov_rank"))
        confidence = bool(self.option(config, "confidence_head"))
        fields = {"markov_rank": rank, "markov_head_type": "vanilla", "sample_from_anchor": False,
                  "has_confidence_head": confidence, "enable_confidence_head": confidence}
        if confidence:
            fields["confidence_head_with_markov"] = True
        return {**fields, "dspark_config": {"markov_rank": rank, "markov_head_type": "vanilla",
                                            "sample_from_anchor": False}}

    def options_from_serving(self, config):
        """``markov_rank`` (top level, ``dspark_config`` or ``dflash_config``), and the confidence head
        from ``has_confidence_head`` or vLLM's ``enable_confidence_head`` (exports with neither ship one)."""
        nested = {**(config.get("dflash_config") or {}), **(config.get("dspark_config") or {})}
        rank = config.get("markov_rank", nested.get("markov_rank"))
        if rank is None:
            raise ValueError(f"missing required field 'markov_rank' of a {self.architecture}")
        confidence = config.get("has_confidence_head", config.get("enable_confidence_head", True))
        return {"markov_rank": int(rank), "confidence_head": bool(confidence)}

    def check_options(self, options, config):
        super().check_options(options, config)
        values = {**self.options, **options}
        rank = values["markov_rank"]
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"drafter.options.markov_rank must be a positive integer, got {rank!r}")
        if not isinstance(values["confidence_head"], bool):
            raise ValueError(f"drafter.options.confidence_head must be true or false, got {values['confidence_head']!r}")


DSPARK = register_kind(DSparkKind())

