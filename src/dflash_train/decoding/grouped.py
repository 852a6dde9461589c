"""Grouped-query attention for the static decoder's target steps, with no K/V copies.

Hugging Face's SDPA path gets a ready 4D mask from the static decoder, and with a mask
it cannot use SDPA's ``enable_gqa`` on CUDA (that falls back to the math kernel), so for
more than one query token (a verify step) it first copies the whole cache ``group``
times (``repeat_kv``): ``2 x heads x max_len x head_dim`` floats per layer and step.
Under ``torch.compile`` it does so even for one query token. Here the ``group`` query
heads that share a K/V head become extra query rows of that head instead:

    query (b, kv_heads * group, q, d) -> (b, kv_heads, group * q, d)

and the mask, shared by all heads, is repeated ``group`` times along its rows (a few
KB). Every (query, key) pair meets the same K/V head as with ``repeat_kv``, and each
softmax row is the same row, so the result equals the stock path up to float rounding.
"""

from __future__ import annotations

import contextlib

import torch.nn.functional as F

NAME = "dflash_static_grouped_sdpa"


def grouped_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """HF attention-interface function; falls back to the stock SDPA path when there is
    nothing to group, no mask (causality would be implicit) or a per-head mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if kv_heads == heads or attention_mask is None or attention_mask.shape[1] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    group = heads // kv_heads
    packed = query.reshape(batch, kv_heads, group * q_len, dim)
    rows = attention_mask.shape[2]
    mask = attention_mask[:, :, None].expand(batch, 1, group, rows, attention_mask.shape[-1])
    mask = mask.reshape(batch, 1, group * rows, attention_mask.shape[-1])
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


def _register() -> bool:
    try:
        from transformers import AttentionInterface
    except ImportError:  # pragma: no cover - an old transformers: keep the stock path
        return False
    AttentionInterface.register(NAME, grouped_attention)
    return True


@contextlib.contextmanager
def grouped_sdpa(model, enabled: bool = True):
    """Route ``model``'s SDPA attention through :func:`grouped_attention` inside the block.

    Only a model on the ``sdpa`` implementation switches (eager or flash attention keep
    theirs); the previous setting is restored on exit, so the reference loops that share
    the model still run the stock path."""
    config = model.config
    before = getattr(config, "_attn_implementation", None)
    if not enabled or before not in ("sdpa", NAME) or not _register():
        yield False
        return
    config._attn_implementation = NAME
    try:
        yield True
    finally:
        config._attn_implementation = before
