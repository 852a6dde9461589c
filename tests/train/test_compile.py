"""Compilation: one graph per drafter layer kind, and the first step's report."""

from __future__ import annotations

import torch
from testkit import tiny_drafter, tiny_qwen3
from torch._dynamo.utils import counters

from dflash_train.models.target import Target
from dflash_train.objective.blocks import sample_batch_anchors
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks
from dflash_train.run_folder import COMPILE_ARTIFACTS
from dflash_train.train import compilation
from dflash_train.train.parallelize import parallelize_drafter


def _train_step(target, drafter, seq=24, block=4):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (2, seq), generator=g)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :4] = 0
    anchors, keep = sample_batch_anchors(loss_mask, torch.arange(2), 6, 0, 0)
    opts = ObjectiveOptions(block, 3, ObjectiveConfig(gamma=4.0), attention="sdpa")
    blocks = make_blocks(ids, loss_mask, anchors, keep, opts)
    features = target.features(ids, torch.ones_like(ids), drafter.config.target_layer_ids)
    out = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
    out.weighted_ce.backward()


def _graphs_after_two_steps(checkpointing: bool) -> int:
    target = Target(tiny_qwen3())
    drafter, _ = tiny_drafter(target, num_layers=3, block_size=4)
    parallelize_drafter(drafter, activation_checkpointing=checkpointing, compile=True)
    torch._dynamo.reset()
    counters.clear()
    _train_step(target, drafter)
    _train_step(target, drafter)  # a second step adds nothing
    assert all(p.grad is not None for p in drafter.parameters())
    return counters["stats"]["unique_graphs"]


def test_drafter_layers_compile_once_per_kind():
    """Three full-attention layers, forward and backward, two steps: ONE dynamo graph. Layer 0's
    input (the frozen embedding) used to differ from the others' in requires_grad, which
    compiled the layer twice (forward and backward) on every cold start."""
    assert _graphs_after_two_steps(checkpointing=False) == 1


def test_drafter_layers_compile_once_with_activation_checkpointing():
    assert _graphs_after_two_steps(checkpointing=True) == 1


def test_compiled_gradients_match_eager():
    """The requires-grad pre-hook changes no gradient: compiled == eager, parameter by parameter."""
    target = Target(tiny_qwen3())
    grads = []
    for compile in (False, True):
        drafter, _ = tiny_drafter(target, num_layers=2, block_size=4, seed=1)
        parallelize_drafter(drafter, activation_checkpointing=False, compile=compile)
        _train_step(target, drafter)
        grads.append({n: p.grad.clone() for n, p in drafter.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_first_step_report_and_artifacts(tmp_path, monkeypatch):
    """The cache state is said before the first step, the compile time after it; rank 0 writes
    the compile artifacts into the run folder, and a second run loads them (warm)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    lines = []
    first = compilation.FirstStep(tmp_path / "run", None, enabled=True, is_main=True, echo=lines.append)
    assert first.state == "empty" and "first step only" in lines[0]
    target = Target(tiny_qwen3())
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=4)
    parallelize_drafter(drafter, activation_checkpointing=False, compile=True)
    _train_step(target, drafter)
    report = first.done(12.5)
    assert report["compile_cache"] == "empty" and report["first_step_s"] == 12.5
    assert 0 < report["compile_s"] < 12.5 + 600
    assert report["compile_graphs"]["from_cache"] == 0 and report["compile_graphs"]["compiled"] > 0
    assert "first step 12.5 s" in lines[-1] and "0 from the cache" in lines[-1]
    assert first.done(1.0) == {}  # reported once
    assert (tmp_path / "run" / COMPILE_ARTIFACTS).stat().st_size > 0
    torch._dynamo.reset()  # a new process, as far as dynamo knows: the graphs come from the disk cache
    again = compilation.FirstStep(tmp_path / "run", None, enabled=True, is_main=True, echo=lines.append)
    assert again.state == "warm" and "compile-artifacts.bin" in lines[-1]
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=4)
    parallelize_drafter(drafter, activation_checkpointing=False, compile=True)
    _train_step(target, drafter)
    graphs = again.done(1.0)["compile_graphs"]
    assert graphs == {"from_cache": report["compile_graphs"]["compiled"], "compiled": 0}
