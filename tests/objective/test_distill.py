"""Distillation toward the target's own distribution (``objective.targets``: kl, tv, mixed with ce):
the chunked loss and its gradient against full-logits references written term by term, the old
soft-target CE as the gradient of {ce, kl}, and the target's source position against a plain HF
forward."""

from __future__ import annotations

import pytest
import torch

from dflash_train.objective.blocks import build_blocks, decay_weights, predicting_states
from dflash_train.objective.loss import LossOptions, dflash_loss, reference_loss


def full_reference(hidden, lm_head, labels, weights, target_hidden, targets):
    """sum_i w_i * sum_t c_t term_t(i) / sum w, every logit at once (positions 1..B-1), each term
    by its textbook formula."""
    z = (hidden[:, :, 1:] @ lm_head.t()).float()
    log_q = torch.log_softmax(z, dim=-1)
    q = log_q.exp()
    p = torch.softmax((target_hidden @ lm_head.t()).float(), dim=-1)
    terms = {"ce": -log_q.gather(-1, labels[..., 1:, None])[..., 0],
             "kl": (p * (p.log() - log_q)).sum(-1),
             "tv": 0.5 * (p - q).abs().sum(-1)}
    loss = sum(c * terms[name] for name, c in targets)
    w = weights[..., 1:]
    return (loss * w).sum() / w.sum()


def random_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    rows, num_blocks, block, hidden, vocab = 2, 3, 5, 16, 50
    h = torch.randn(rows, num_blocks * block, hidden, generator=g, dtype=torch.float64)
    head = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    labels = torch.randint(0, vocab, (rows, num_blocks, block), generator=g)
    valid = torch.rand(rows, num_blocks, block, generator=g) > 0.2
    valid[..., 0] = False
    weights = decay_weights(block, 3.0).double() * valid
    target_hidden = torch.randn(rows, num_blocks, block - 1, hidden, generator=g, dtype=torch.float64)
    return h, head, labels, weights, valid, target_hidden


MIXES = [(("ce", 1.0),), (("ce", 0.5), ("kl", 0.5)), (("kl", 1.0),), (("tv", 1.0),), (("ce", 0.1), ("tv", 0.9))]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("targets", MIXES, ids=lambda t: "+".join(f"{n}{c:g}" for n, c in t))
def test_chunked_loss_and_gradient_equal_full_logits_reference(targets, compiled):
    h, head, labels, weights, valid, target_hidden = random_case()
    rows, num_blocks, block = labels.shape
    h = h.requires_grad_()
    needs = any(name != "ce" for name, _ in targets)
    out = dflash_loss(h, head, labels, weights, valid, LossOptions(chunk_size=7, targets=targets, compiled=compiled),
                      target_hidden if needs else None)
    loss = out.weighted_ce / weights[..., 1:].sum()
    (grad,) = torch.autograd.grad(loss, h)
    h_ref = h.detach().clone().requires_grad_()
    ref = full_reference(h_ref.view(rows, num_blocks, block, -1), head, labels, weights, target_hidden, targets)
    (grad_ref,) = torch.autograd.grad(ref, h_ref)
    torch.testing.assert_close(loss.double(), ref)
    torch.testing.assert_close(grad, grad_ref)
    if not needs:  # the plain path is the unchunked label CE
        plain = reference_loss(h.detach().view(rows, num_blocks, block, -1), head, labels, weights, valid)
        torch.testing.assert_close(loss.double(), plain)
    # accuracy stays against the hard labels
    argmax = (h.detach().view(rows, num_blocks, block, -1) @ head.t()).argmax(-1)
    assert torch.equal(out.correct, (argmax == labels)[..., 1:] & valid[..., 1:])


def test_the_old_soft_target_ce_has_the_gradient_of_ce_plus_kl():
    """train.distill=d (the CE toward (1 - d) onehot + d p) moved to {ce: 1 - d, kl: d}: equal
    gradients (the losses differ by d times the target's entropy, a constant)."""
    h, head, labels, weights, valid, target_hidden = random_case(1)
    rows, num_blocks, block = labels.shape
    d = 0.3
    h = h.requires_grad_()
    out = dflash_loss(h, head, labels, weights, valid, LossOptions(7, targets=(("ce", 1 - d), ("kl", d))),
                      target_hidden)
    (grad,) = torch.autograd.grad(out.weighted_ce, h)
    h_ref = h.detach().clone().requires_grad_()
    z = (h_ref.view(rows, num_blocks, block, -1)[:, :, 1:] @ head.t())
    soft = (1 - d) * torch.nn.functional.one_hot(labels[..., 1:], head.shape[0]).double() + \
        d * torch.softmax(target_hidden @ head.t(), -1)
    soft_ce = (-(soft * torch.log_softmax(z, -1)).sum(-1) * weights[..., 1:]).sum()
    (grad_ref,) = torch.autograd.grad(soft_ce, h_ref)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-4, atol=1e-5)  # the chunks' logits are float32


def test_a_mismatched_target_input_is_refused():
    h, head, labels, weights, valid, target_hidden = random_case()
    with pytest.raises(ValueError, match="kl/tv need"):
        dflash_loss(h, head, labels, weights, valid, LossOptions(7, targets=(("kl", 1.0),)))
    with pytest.raises(ValueError, match="kl/tv need"):
        dflash_loss(h, head, labels, weights, valid, LossOptions(7), target_hidden)


def test_soft_target_is_the_targets_next_token_distribution_at_the_predicting_position(tiny_target):
    """For label x[a + k] the soft target is softmax of the target's logits at a + k - 1: a plain
    HF forward of the row (row 0) or of the label's own conversation alone (packed row 1)."""
    model, head = tiny_target.model, tiny_target.lm_head_weight
    g = torch.Generator().manual_seed(3)
    seq, block, layer_ids = 20, 4, [1, 3]
    ids = torch.randint(0, 120, (2, seq), generator=g)
    loss_mask = torch.ones(2, seq, dtype=torch.long)
    loss_mask[:, :3] = 0
    doc_ids = torch.tensor([[5] * seq, [7] * 11 + [8] * 7 + [-1] * 2])
    loss_mask[1, 18:] = 0
    anchors = torch.tensor([[3, 9, 17], [4, 8, 12]])  # row 1: block at 8 crosses into conversation 8
    keep = torch.ones(2, 3, dtype=torch.bool)
    blocks = build_blocks(ids, loss_mask, anchors, keep, block, mask_token_id=127, gamma=4.0, doc_ids=doc_ids)
    features, final = tiny_target.features(ids, None, layer_ids, doc_ids, final_hidden=True)
    plain = tiny_target.features(ids, None, layer_ids, doc_ids)
    torch.testing.assert_close(features, plain)  # the untruncated run gives the same features
    soft = torch.softmax(predicting_states(blocks, final) @ head.t(), dim=-1)  # [rows, A, B-1, V]
    with torch.no_grad():
        whole = model(ids[:1]).logits[0]
        docs = {d: model(ids[1:, doc_ids[1] == d]).logits[0] for d in (7, 8)}
    checked = 0
    for row in range(2):
        for j, a in enumerate(anchors[row].tolist()):
            for k in range(1, block):
                if not blocks.valid[row, j, k]:
                    continue
                if row == 0:
                    expected = whole[a + k - 1]
                else:
                    doc = int(doc_ids[1, a])
                    expected = docs[doc][a + k - 1 - (doc_ids[1] == doc).nonzero().min()]
                torch.testing.assert_close(soft[row, j, k - 1], torch.softmax(expected, -1))
                checked += 1
    assert checked >= 12 and not blocks.valid[1, 1, 3]  # x[11] belongs to the next conversation
