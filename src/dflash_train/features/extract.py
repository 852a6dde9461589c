"""The target's context features of one micro-batch: what online training reads and what a feature store
keeps. It lives in the features layer, below ``train/``, because both the store's writers (the dump, the
hybrid mode) and training's online source call it."""

from __future__ import annotations


def target_features(target, layer_ids: list[int], final_hidden: bool, micro_batch, input_ids, attention_mask):
    """The target's features of a micro-batch, packed or not (and its final hidden states with
    ``final_hidden``): what online training reads, and what ``dflash-train features`` stores."""
    if micro_batch.doc_ids is None:
        return target.features(input_ids, attention_mask, layer_ids, final_hidden=final_hidden)
    doc_ids = micro_batch.doc_ids.to(input_ids.device, non_blocking=True)
    return target.features(input_ids, None, layer_ids, doc_ids, final_hidden=final_hidden)
