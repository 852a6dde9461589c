"""Distillation toward the target's own distribution (train.distill): the chunked soft-target
loss against a full-logits reference, and the soft target's source position against a plain
HF forward."""

from __future__ import annotations

import pytest
import torch

from dflash_train.objective.blocks import build_blocks, decay_weights, predicting_states
from dflash_train.objective.loss import LossOptions, dflash_loss, reference_loss


def soft_reference(hidden, lm_head, labels, weights, target_hidden, distill):
    """sum_i w_i * -(q_i * log_softmax(z_i)).sum() / sum w, all logits at once (positions 1..B-1)."""
    z = (hidden[:, :, 1:] @ lm_head.t()).float()
    onehot = torch.nn.functional.one_hot(labels[..., 1:], lm_head.shape[0]).to(z.dtype)
    q = (1 - distill) * onehot + distill * torch.softmax((target_hidden @ lm_head.t()).float(), dim=-1)
    ce = -(q * torch.log_softmax(z, dim=-1)).sum(-1)
    w = weights[..., 1:]
    return (ce * w).sum() / w.sum()


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


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("distill", [0.0, 0.5, 1.0])
def test_chunked_soft_loss_and_gradient_equal_full_logits_reference(distill, compiled):
    h, head, labels, weights, valid, target_hidden = random_case()
    rows, num_blocks, block = labels.shape
    h = h.requires_grad_()
    out = dflash_loss(h, head, labels, weights, valid, LossOptions(chunk_size=7, distill=distill, compiled=compiled),
                      target_hidden)
    loss = out.weighted_ce / out.weight_sum
    (grad,) = torch.autograd.grad(loss, h)
    h_ref = h.detach().clone().requires_grad_()
    ref = soft_reference(h_ref.view(rows, num_blocks, block, -1), head, labels, weights, target_hidden, distill)
    (grad_ref,) = torch.autograd.grad(ref, h_ref)
    torch.testing.assert_close(loss.double(), ref)
    torch.testing.assert_close(grad, grad_ref)
    if distill == 0:  # the soft path at distill 0 is today's hard-label CE
        plain = reference_loss(h.detach().view(rows, num_blocks, block, -1), head, labels, weights, valid)
        torch.testing.assert_close(loss.double(), plain)
    else:  # and the target's distribution does move it
        plain = dflash_loss(h.detach(), head, labels, weights, valid, LossOptions(chunk_size=7))
        assert not torch.allclose(loss.double(), plain.weighted_ce / plain.weight_sum)
    # accuracy stays against the hard labels
    argmax = (h.detach().view(rows, num_blocks, block, -1) @ head.t()).argmax(-1)
    assert torch.equal(out.correct, (argmax == labels)[..., 1:] & valid[..., 1:])


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
