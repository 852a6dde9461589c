"""What ``objective/step.py`` hands on, pinned where mutation testing found it unchecked (issue 60.4).

mutmut over ``step.py``, against the objective tests without their training runs, left alive what only the
training runs reach: the target's distribution handed to a kl/tv loss, a packed micro-batch's
conversation starts and positions, a sliding window's masks, the kind's options, a wrapper's inner module,
and ``loss_options`` (a zero-weight target, the compiled loss). These tests record what ``drafter_loss``
gives the masks, the drafter and the loss, and compare it with what it must give.
"""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

import dflash_train.objective.step as step
from dflash_train.models.target import Target
from dflash_train.objective.blocks import build_blocks, predicting_states
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks, unwrap


@pytest.fixture(scope="module")
def pair():
    target = Target(tiny_qwen3(vocab=64))
    drafter, cfg = tiny_drafter(target, block_size=4, num_layers=2, seed=1,
                                layer_types=["sliding_attention", "full_attention"], sliding_window=3)
    return target, drafter.eval(), cfg


def _packed(target, cfg, opts):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 60, (1, 14), generator=g)
    doc_ids = torch.tensor([[3] * 6 + [4] * 8])
    loss_mask = torch.ones_like(ids)
    blocks = make_blocks(ids, loss_mask, torch.tensor([[1, 7, 9]]), torch.ones(1, 3, dtype=torch.bool), opts, doc_ids)
    features = torch.randn(1, 14, cfg.num_target_features * cfg.hidden_size, generator=g)
    return ids, doc_ids, loss_mask, blocks, features


def test_make_blocks_passes_the_conversations_and_the_last_position(pair):
    target, drafter, cfg = pair
    opts = ObjectiveOptions(4, 63).with_objective(loss_positions=2)
    ids, doc_ids, loss_mask, blocks, _ = _packed(target, cfg, opts)
    want = build_blocks(ids, loss_mask, torch.tensor([[1, 7, 9]]), torch.ones(1, 3, dtype=torch.bool), 4, 63,
                        opts.gamma, doc_ids, 2)
    for name in ("tokens", "positions", "labels", "weights", "valid", "context_positions", "starts"):
        assert torch.equal(getattr(blocks, name), getattr(want, name)), name


def test_drafter_loss_hands_on_the_starts_window_positions_distribution_and_kind_options(pair, monkeypatch):
    target, drafter, cfg = pair
    opts = ObjectiveOptions(4, 63).with_objective(targets={"ce": 0.5, "kl": 0.5})
    ids, doc_ids, loss_mask, blocks, features = _packed(target, cfg, opts)
    hidden = torch.randn(1, 14, cfg.hidden_size)
    with pytest.raises(ValueError) as err:
        drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
    assert str(err.value) == "objective.targets kl/tv need the target's final hidden states"
    seen = {}
    real_masks, real_loss = step.build_masks, step.dflash_loss

    def masks(*args):
        seen["masks"] = args
        return real_masks(*args)

    def loss(*args):
        seen["loss"] = args
        return real_loss(*args)

    class Recording(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

        def forward(self, *args):
            seen["drafter"] = args
            return self.module(*args)

    monkeypatch.setattr(step, "build_masks", masks)
    monkeypatch.setattr(step, "dflash_loss", loss)
    drafter_loss(Recording(drafter), target.embed_tokens, target.lm_head_weight, features, blocks, opts, hidden)
    assert seen["masks"][6] == 3 and seen["masks"][7] is blocks.starts and blocks.starts is not None
    assert seen["drafter"][3] is blocks.context_positions
    assert torch.equal(seen["loss"][6], predicting_states(blocks, hidden))
    assert seen["loss"][-1] == opts.objective.kind_options("dflash")


def test_an_unpacked_micro_batch_gets_row_positions(pair, monkeypatch):
    target, drafter, cfg = pair
    opts = ObjectiveOptions(4, 63)
    ids = torch.randint(0, 60, (2, 10))
    blocks = make_blocks(ids, torch.ones_like(ids), torch.tensor([[1, 5], [0, 3]]), torch.ones(2, 2, dtype=torch.bool),
                         opts)
    seen = {}
    real = drafter.forward
    monkeypatch.setattr(drafter, "forward", lambda *args: seen.setdefault("args", args) and real(*args))
    drafter_loss(drafter, target.embed_tokens, target.lm_head_weight,
                 torch.randn(2, 10, cfg.num_target_features * cfg.hidden_size), blocks, opts)
    assert torch.equal(seen["args"][3], torch.arange(10).expand(2, 10))


def test_unwrap_and_the_loss_options():
    inner = torch.nn.Linear(2, 2)

    class Wrapper:
        module = inner

    assert unwrap(Wrapper()) is inner and unwrap(inner) is inner
    opts = ObjectiveOptions(4, 63, compiled_loss=True).with_objective(targets={"ce": 1.0, "tv": 0.0})
    loss = opts.loss_options()
    assert loss.targets == (("ce", 1.0),) and loss.compiled is True


def test_a_kinds_loss_gets_its_default_settings(monkeypatch):
    """DSpark trained with no ``objective.kind`` settings: its term gets its defaults (a confidence
    weight of 1.0), not an empty dict it would read a missing key from."""
    target = Target(tiny_qwen3(vocab=64))
    drafter, cfg = tiny_drafter(target, block_size=4, num_layers=1, kind="dspark")
    opts = ObjectiveOptions(4, 63)
    ids = torch.randint(0, 60, (1, 10), generator=torch.Generator().manual_seed(0))
    blocks = make_blocks(ids, torch.ones_like(ids), torch.tensor([[1, 5]]), torch.ones(1, 2, dtype=torch.bool), opts)
    seen = {}
    real = step.dflash_loss
    monkeypatch.setattr(step, "dflash_loss", lambda *args: seen.setdefault("options", args[-1]) and real(*args))
    drafter_loss(drafter.eval(), target.embed_tokens, target.lm_head_weight,
                 torch.randn(1, 10, cfg.num_target_features * cfg.hidden_size), blocks, opts)
    assert seen["options"] == {"confidence_weight": 1.0}
