"""``objective.weighting: reach``: each position's weight times the drafter's detached probability of
reaching it (the product of its label probabilities at the block's earlier positions), checked
against an unchunked reference that builds the factor by an explicit loop over positions."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.models.target import Target
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.objective.loss import LossOptions, _even_chunk, chunked_weighted_ce, reference_loss
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks
from tests.objective.test_loss_positions import BLOCK, _batch


def _inputs(seed=0, blocks=9, positions=5, h=16, vocab=40):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(blocks * positions, h, generator=g, dtype=torch.float32)
    head = torch.randn(vocab, h, generator=g, dtype=torch.float32)
    labels = torch.randint(0, vocab, (blocks * positions,), generator=g)
    # a sharp head makes some label probabilities large, so the factors spread over (0, 1]
    labels[::3] = (hidden[::3] @ head.t()).argmax(-1)
    weights = torch.rand(blocks * positions, generator=g, dtype=torch.float32)
    return hidden, head, labels, weights


@pytest.mark.parametrize("chunk", [5, 7, 14, 1000])
def test_chunked_reach_weighting_equals_the_reference(chunk):
    """Loss and input gradient equal the full-logits reference for chunk sizes that do and do
    not divide the block length (chunks are rounded to whole blocks)."""
    k = 5
    hidden, head, labels, weights = _inputs(positions=k)
    x = hidden.clone().requires_grad_()
    loss, _ = chunked_weighted_ce(x, head, labels, weights, LossOptions(chunk, block=k, weighting="reach"))
    loss.backward()
    y = hidden.clone().requires_grad_()
    ref = reference_loss(y.view(-1, k, y.shape[-1]), head, labels.view(-1, k), weights.view(-1, k), None,
                         reach=True) * weights.sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(x.grad, y.grad)
    plain, _ = chunked_weighted_ce(hidden, head, labels, weights, LossOptions(chunk))
    assert loss < plain - 1e-3  # the factor changed the loss (it is < 1 after the first position)


def test_the_factor_is_detached_and_excludes_the_position_itself():
    """Two mutations of the reference, each must differ from the chunked result: the factor with
    its gradient kept, and the factor including the position's own probability."""
    k = 4
    hidden, head, labels, weights = _inputs(seed=1, positions=k)
    x = hidden.clone().requires_grad_()
    chunked_weighted_ce(x, head, labels, weights, LossOptions(8, block=k, weighting="reach"))[0].backward()

    y = hidden.clone().requires_grad_()
    logits = y @ head.t()
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none").view(-1, k)
    p = torch.exp(-ce)
    kept_grad = torch.cat([torch.ones_like(p[:, :1]), torch.cumprod(p, 1)[:, :-1]], 1)
    (ce * weights.view(-1, k) * kept_grad).sum().backward()
    assert not torch.allclose(x.grad, y.grad, atol=1e-6)

    own = torch.cumprod(torch.exp(-ce.detach()), 1)
    with_own = (ce.detach() * weights.view(-1, k) * own).sum()
    assert not torch.allclose(chunked_weighted_ce(hidden, head, labels, weights, LossOptions(8, block=k, weighting="reach"))[0],
                              with_own.float(), atol=1e-6)


def test_first_position_is_always_reached():
    """With only the first position weighted, reach weighting changes nothing."""
    k = 5
    hidden, head, labels, weights = _inputs(seed=2, positions=k)
    weights = weights.view(-1, k).clone()
    weights[:, 1:] = 0
    weights = weights.reshape(-1)
    a, _ = chunked_weighted_ce(hidden, head, labels, weights, LossOptions(10, block=k, weighting="reach"))
    b, _ = chunked_weighted_ce(hidden, head, labels, weights, LossOptions(10))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("rows,chunk,align", [(45, 14, 5), (15360, 4096, 15), (8192, 4096, 8), (7, 100, 7)])
def test_even_chunks_hold_whole_blocks(rows, chunk, align):
    """Chunks are whole blocks, no more of them than ``chunk`` would give, and each at most
    ``chunk`` rounded up to a whole block."""
    size = _even_chunk(rows, chunk, align)
    assert size % align == 0 and -(-rows // size) <= max(1, -(-rows // chunk))
    assert size <= -(-chunk // align) * align or size == align


def test_rows_that_are_not_whole_blocks_are_refused():
    hidden, head, labels, weights = _inputs(positions=5)
    with pytest.raises(ValueError, match="whole blocks"):
        chunked_weighted_ce(hidden[:-1], head, labels[:-1], weights[:-1], LossOptions(8, block=5, weighting="reach"))


@pytest.mark.parametrize("last", [None, 3])
def test_objective_with_reach_weighting_equals_the_reference(last):
    """The whole objective (tiny drafter, real blocks with padding and a position limit) against
    ``reference_loss(reach=True)`` on the same drafter states: loss and drafter gradients."""
    target = Target(tiny_qwen3())
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=BLOCK, seed=3)
    ids, loss_mask, anchors, keep = _batch()
    opts = ObjectiveOptions(BLOCK, 3, ObjectiveConfig(gamma=2.0, chunk_size=7, loss_positions=last, weighting="reach"))
    blocks = make_blocks(ids, loss_mask, anchors, keep, opts)
    features = target.features(ids, torch.ones_like(ids), drafter.config.target_layer_ids)
    out = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
    drafter.zero_grad(set_to_none=True)
    (out.weighted_ce / opts.normalizer(blocks)).backward()
    grads = [p.grad.clone() for p in drafter.parameters()]

    # the reference: the same drafter states, full logits, the factor by a loop
    from dflash_train.models.attention import build_masks

    end = opts.last_position + 1
    masks = build_masks("sdpa", drafter.layer_types, blocks.anchors, blocks.keep, ids.shape[1], BLOCK,
                        drafter.sliding_window, blocks.starts)
    hidden = drafter(target.embed_tokens(blocks.tokens), features, blocks.positions,
                     torch.arange(ids.shape[1]).expand(ids.shape[0], -1), masks)
    hidden = hidden.view(*blocks.labels.shape, -1)[:, :, 1:end]
    sl = (slice(None), slice(None), slice(1, end))
    drafter.zero_grad(set_to_none=True)
    ref = reference_loss(hidden, target.lm_head_weight, blocks.labels[sl], blocks.weights[sl], None, reach=True)
    ref.backward()
    torch.testing.assert_close(out.weighted_ce / opts.normalizer(blocks), ref)
    for g, p in zip(grads, drafter.parameters()):
        torch.testing.assert_close(g, p.grad)
    off = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks,
                       ObjectiveOptions(BLOCK, 3, ObjectiveConfig(gamma=2.0, chunk_size=7, loss_positions=last)))
    assert out.weighted_ce < off.weighted_ce - 1e-3  # the option reached the loss


def test_reach_composes_with_a_distillation_target():
    """Weightings and targets are independent entries: reach with {ce, kl} is the reach-weighted sum
    of the two terms (reach from the label's CE), checked against full logits."""
    torch.manual_seed(5)
    k, n, vocab, h = 3, 12, 17, 6
    x, head = torch.randn(n, h), torch.randn(vocab, h)
    t_hidden = torch.randn(n, h)
    labels, weights = torch.randint(0, vocab, (n,)), torch.rand(n)
    opts = LossOptions(5 * k, targets=(("ce", 0.4), ("kl", 0.6)), block=k, weighting="reach")
    loss, _ = chunked_weighted_ce(x, head, labels, weights, opts, t_hidden)
    logits, p = x @ head.t(), torch.softmax(t_hidden @ head.t(), -1)
    log_q = torch.log_softmax(logits, -1)
    ce = -log_q.gather(1, labels[:, None])[:, 0]
    kl = (p * (p.log() - log_q)).sum(-1)
    reach = torch.ones(n)
    for j in range(1, k):
        reach.view(-1, k)[:, j] = reach.view(-1, k)[:, j - 1] * torch.exp(-ce.view(-1, k)[:, j - 1])
    torch.testing.assert_close(loss, ((0.4 * ce + 0.6 * kl) * weights * reach).sum(), rtol=1e-4, atol=1e-5)


def test_tiny_training_with_reach_weighting_runs_and_learns(tmp_path):
    """End to end through the trainer's config (CPU): the option reaches the step's loss."""
    import json
    import math
    from pathlib import Path

    from testkit import tiny_chat_job, tiny_chat_target

    from dflash_train.config import config_from_dict
    from dflash_train.train.loop import train

    smollm2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
    losses = {}
    for name, extra in (("reach", {"max_steps": 12}), ("plain", {"max_steps": 1})):
        job = tiny_chat_job(tmp_path / name, {"weighting": "reach"} if name == "reach" else None, **extra)
        train(config_from_dict(job), target=tiny_chat_target(smollm2), echo=lambda *a: None)
        rows = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in rows if "loss" in r]
    reach = losses["reach"]
    assert len(reach) == 12 and all(math.isfinite(x) for x in reach), reach
    assert sum(reach[-3:]) < sum(reach[:3]), reach
    assert reach[0] < losses["plain"][0] - 1e-3  # reach factors < 1 after position 1 lower the first loss
