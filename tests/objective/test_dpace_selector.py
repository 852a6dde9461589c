"""D-PACE weighting and DFlash2's selector CE against unchunked loop references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.config import config_from_dict
from dflash_train.models.target import Target
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.objective.kinds.dflash2 import selector_ce
from dflash_train.objective.loss import LossOptions, chunked_weighted_ce
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks


def _inputs(seed=0, blocks=6, k=5, h=16, vocab=40):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(blocks * k, h, generator=g)
    head = torch.randn(vocab, h, generator=g) * 0.7
    labels = torch.randint(0, vocab, (blocks * k,), generator=g)
    labels[::2] = (hidden[::2] @ head.t()).argmax(-1)  # confident positions, so q spreads over (0, 1)
    mask = (torch.rand(blocks * k, generator=g) > 0.2).float()
    return hidden, head, labels, mask


def _dpace_loop(hidden, head, labels, mask, k, alpha):
    """The definition, position by position: w_k = m_k sum_{j>=k} m_j prod_{i<=j} s_i."""
    ce = F.cross_entropy(hidden @ head.t(), labels, reduction="none").view(-1, k)
    m = mask.view(-1, k)
    total = 0.0
    for b in range(ce.shape[0]):
        s = [((1 - alpha) * math.exp(-float(ce[b, i].detach())) + alpha) if m[b, i] else 1.0 for i in range(k)]
        C = [math.prod(s[: j + 1]) for j in range(k)]
        for i in range(k):
            w = float(m[b, i]) * sum(float(m[b, j]) * C[j] for j in range(i, k))
            total = total + float(m[b, i]) * w * ce[b, i]
    return total


@pytest.mark.parametrize("chunk", [5, 7, 1000])
@pytest.mark.parametrize("alpha", [0.5, 0.0])
def test_dpace_chunked_equals_loop_reference(chunk, alpha):
    k = 5
    hidden, head, labels, mask = _inputs()
    x = hidden.clone().requires_grad_()
    loss, _ = chunked_weighted_ce(x, head, labels, mask * 0.3, LossOptions(chunk, block=k, weighting="dpace",
                                                                           dpace_alpha=alpha))
    loss.backward()
    y = hidden.clone().requires_grad_()
    ref = _dpace_loop(y, head, labels, mask, k, alpha)
    ref.backward()
    torch.testing.assert_close(loss, ref.float())
    torch.testing.assert_close(x.grad, y.grad)
    plain, _ = chunked_weighted_ce(hidden, head, labels, mask, LossOptions(chunk))
    assert abs(float(loss) - float(plain)) > 1e-3  # the weights differ from the mask


def _brute_selector(selector, hidden, head, labels, preds, weights, top_k, inject):
    total, picks = 0.0, []
    A, Bk, P = selector.predecessor_codebook, selector.successor_codebook, selector.hidden_projection.weight
    for i in range(hidden.shape[0]):
        logits = hidden[i] @ head.t()
        cands = sorted(range(head.shape[0]), key=lambda v: -float(logits[v]))[:top_k]
        present = int(labels[i]) in cands
        if inject and not present:
            cands[-1] = int(labels[i])
        s = torch.stack([logits[c] + (A[preds[i]] * (P @ hidden[i]) * Bk[c]).sum() for c in cands])
        if present or inject:
            total = total + weights[i] * (torch.logsumexp(s, 0) - s[cands.index(int(labels[i]))])
        picks.append(cands[int(s.argmax())] if present else -1)
    return total, picks


@pytest.mark.parametrize("inject", [False, True])
def test_selector_ce_against_brute_force(inject):
    target = Target(tiny_qwen3(num_layers=4, vocab=40, hidden=32))
    drafter, _ = tiny_drafter(target, num_layers=1, block_size=4, target_layer_ids=[1], kind="dflash2",
                              options={"conv_group_size": 16, "selector_rank": 6, "selector_top_k": 4})
    sel = drafter.candidate_selector
    with torch.no_grad():
        sel.successor_codebook.normal_(std=0.5)
    hidden, head, labels, _ = _inputs(seed=2, blocks=4, k=3, h=32, vocab=40)
    g = torch.Generator().manual_seed(9)
    preds = torch.randint(0, 40, labels.shape, generator=g)
    weights = torch.rand(labels.shape, generator=g)
    cands = torch.topk(hidden @ head.t(), 4, dim=-1).indices
    x = hidden.clone().requires_grad_()
    total, picks = selector_ce(sel, x, head, labels, preds, cands, weights, "inject" if inject else "exclude",
                               chunk_size=5)
    total.backward()
    gx, gsel = x.grad.clone(), sel.successor_codebook.grad.clone()
    sel.zero_grad()
    y = hidden.clone().requires_grad_()
    ref, ref_picks = _brute_selector(sel, y, head, labels, preds, weights, 4, inject)
    ref.backward()
    torch.testing.assert_close(total, ref.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, y.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gsel, sel.successor_codebook.grad, rtol=1e-4, atol=1e-5)
    assert picks.tolist() == ref_picks
    assert -1 in ref_picks  # some labels are outside the top-k: the two variants really differ


def test_dflash2_objective_teacher_forces_the_predecessor():
    """The objective's predecessors are the anchor then the labels: shifting them changes the loss."""
    target = Target(tiny_qwen3(num_layers=4))
    drafter, _ = tiny_drafter(target, num_layers=1, block_size=4, target_layer_ids=[1], kind="dflash2",
                              options={"conv_group_size": 16, "selector_rank": 8, "selector_top_k": 6})
    with torch.no_grad():
        drafter.candidate_selector.successor_codebook.normal_(std=1.0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (1, 20), generator=g)
    anchors, keep = torch.tensor([[2, 6, 11]]), torch.ones(1, 3, dtype=torch.bool)
    opts = ObjectiveOptions(4, 127, ObjectiveConfig(gamma=2.0, chunk_size=5, kind={'selector_out_of_topk': "inject"}))
    blocks = make_blocks(ids, torch.ones_like(ids), anchors, keep, opts)
    features = target.features(ids, torch.ones_like(ids), [1])
    out = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
    assert out.logs["selector_ce"] > 0
    # the same with predecessors from the wrong positions (anchor everywhere) gives another selector CE
    from dflash_train.objective.kinds import dflash2 as loss_mod

    calls = {}
    original = loss_mod.selector_ce

    def spy(selector, hidden, head, labels, preds, *rest, **kw):
        calls["preds"] = preds.clone()
        return original(selector, hidden, head, labels, preds, *rest, **kw)

    loss_mod.selector_ce = spy
    try:
        drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
    finally:
        loss_mod.selector_ce = original
    want = torch.stack([ids[0, a : a + 3] for a in (2, 6, 11)]).reshape(-1)  # x[a + k - 1], k = 1..3
    assert calls["preds"].tolist() == want.tolist()


def test_config_keys():
    for section, match in [({"weighting": "dpo"}, "objective.weighting"), ({"dpace_alpha": 1.5}, "dpace_alpha")]:
        with pytest.raises(ValueError, match=match):
            ObjectiveConfig(**section).validate()
    job = config_from_dict({"data": {"paths": ["x"]}, "drafter": {"kind": "dflash2"},
                            "target": {"path": "t"}, "objective": {"kind": {"selector_out_of_topk": "drop"}}})
    with pytest.raises(ValueError, match="objective.kind.selector_out_of_topk must be one of"):
        job.validate()
    ObjectiveConfig(weighting="dpace").validate()
