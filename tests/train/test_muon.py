"""Muon (train/muon.py): the orthogonalization against an SVD, the update against a plain per-matrix
reference, the AdamW part against torch's AdamW, a skipped step on the device, and training with it
(learns, graphed == eager, exact resume)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from testkit import dry_capture, tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict
from dflash_train.train import trainer as trainer_mod
from dflash_train.train.cuda_graphs import GraphedStep
from dflash_train.train.loop import train
from dflash_train.train.muon import Muon, muon_param_groups, newton_schulz
from dflash_train.train.trainer import Trainer

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


@pytest.mark.parametrize("shape", [(12, 40), (40, 12), (16, 16)])
def test_newton_schulz_is_near_the_polar_factor(shape):
    """Singular values of the result within Muon's band, singular vectors those of the input (a
    gradient-like input: singular values over two decades; 5 iterations do not lift far smaller ones)."""
    torch.manual_seed(0)
    k = min(shape)
    left = torch.linalg.qr(torch.randn(3, shape[0], k, dtype=torch.float64)).Q
    right = torch.linalg.qr(torch.randn(3, shape[1], k, dtype=torch.float64)).Q
    m = left @ torch.diag(torch.logspace(-1, 1, k, dtype=torch.float64)) @ right.mT
    o = newton_schulz(m).double()
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    s = torch.linalg.svdvals(o)
    assert s.min() > 0.6 and s.max() < 1.25, s
    polar = u @ vh
    cosine = (o * polar).sum((-2, -1)) / (o.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert cosine.min() > 0.97, cosine
    for one, o_one in zip(m, o):  # batched == one at a time
        torch.testing.assert_close(newton_schulz(one).double(), o_one)


class _Net(torch.nn.Module):
    """Two matrices of one shape (one transposed: [5, 3] and [3, 5] share a batch), another shape, a gain."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(3, 5))
        self.b = torch.nn.Parameter(torch.randn(5, 3))
        self.c = torch.nn.Parameter(torch.randn(4, 4))
        self.gain = torch.nn.Parameter(torch.ones(5))

    def forward(self, x):  # x [n, 5]
        return (((x * self.gain) @ self.b) @ self.a @ self.b @ self.c[:3, :3]).pow(2).mean()


def _grads(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 5, generator=g) for _ in range(steps)]


def _reference(net, xs, lr, mu, decay, betas, eps):
    """Muon written out per matrix (momentum, Nesterov, scale, decay) and AdamW for the gain."""
    bufs = {n: torch.zeros_like(p) for n, p in net.named_parameters() if p.ndim == 2}
    m = v = torch.zeros(5)
    for t, x in enumerate(xs, start=1):
        net.zero_grad()
        net(x).backward()
        with torch.no_grad():
            for name, p in net.named_parameters():
                if p.ndim == 2:
                    bufs[name] = mu * bufs[name] + (1 - mu) * p.grad
                    look = (1 - mu) * p.grad + mu * bufs[name]
                    o = newton_schulz(look)
                    p.mul_(1 - lr * decay).sub_(lr * 0.2 * math.sqrt(max(p.shape)) * o)
                else:
                    m = betas[0] * m + (1 - betas[0]) * p.grad
                    v = betas[1] * v + (1 - betas[1]) * p.grad ** 2
                    update = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
                    p.mul_(1 - lr * decay).sub_(lr * update)
    return net


@pytest.mark.parametrize("lr_as_tensor", [False, True])
def test_muon_step_equals_the_plain_reference(lr_as_tensor):
    hyper = dict(lr=0.02, mu=0.9, decay=0.1, betas=(0.8, 0.9), eps=1e-8)
    torch.manual_seed(0)
    want = _reference(_Net(), _grads(4), **hyper)
    torch.manual_seed(0)
    net = _Net()
    groups = muon_param_groups(net)
    assert [len(g["params"]) for g in groups] == [3, 1] and [g["muon"] for g in groups] == [True, False]
    opt = Muon(groups, lr=hyper["lr"], betas=hyper["betas"], weight_decay=hyper["decay"], momentum=hyper["mu"])
    for x in _grads(4):
        opt.zero_grad()
        net(x).backward()
        if lr_as_tensor:  # the graphed step's LR
            for group in opt.param_groups:
                group["lr"] = torch.tensor(hyper["lr"])
        opt.step()
    for p, q in zip(net.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_the_adamw_part_equals_torch_adamw():
    torch.manual_seed(0)
    gain = torch.nn.Parameter(torch.randn(7))
    twin = torch.nn.Parameter(gain.detach().clone())
    ours = Muon([{"params": [gain], "muon": False}], lr=0.01, betas=(0.9, 0.95), weight_decay=0.05)
    theirs = torch.optim.AdamW([twin], lr=0.01, betas=(0.9, 0.95), weight_decay=0.05, eps=1e-8)
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        grad = torch.randn(7, generator=g)
        gain.grad, twin.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
        torch.testing.assert_close(gain, twin, rtol=1e-6, atol=1e-7)


def test_a_skipped_step_changes_nothing_bit_for_bit():
    """found_inf = 1 with NaN gradients: weights and state untouched; the run then goes on as if
    that step had never come (the same weights as without it)."""
    torch.manual_seed(0)
    clean, skipped = _Net(), _Net()
    skipped.load_state_dict(clean.state_dict())
    runs = {}
    for name, net, bad_at in (("clean", clean, None), ("skipped", skipped, 1)):
        opt = Muon(muon_param_groups(net), lr=0.02)
        xs = _grads(3)
        if bad_at is not None:
            xs.insert(bad_at, xs[0])
        for i, x in enumerate(xs):
            opt.zero_grad()
            net(x).backward()
            bad = i == bad_at
            if bad:
                for p in net.parameters():
                    p.grad.fill_(float("nan"))
                before = ({k: v.clone() for k, v in net.state_dict().items()},
                          {k: {n: t.clone() for n, t in s.items()} for k, s in enumerate(opt.state.values())})
            opt.found_inf = torch.tensor(1.0 if bad else 0.0)
            opt.step()
            if bad:
                assert all(torch.equal(v, net.state_dict()[k]) for k, v in before[0].items())
                after = {k: s for k, s in enumerate(opt.state.values())}
                assert all(torch.equal(t, after[k][n]) for k, s in before[1].items() for n, t in s.items())
        runs[name] = net
    for p, q in zip(runs["clean"].parameters(), runs["skipped"].parameters()):
        assert torch.equal(p, q)


def test_sharded_parameters_are_refused():
    net = _Net()
    net.a.device_mesh = object()  # what a DTensor parameter (FSDP2) carries
    with pytest.raises(ValueError, match="FSDP"):
        muon_param_groups(net)


def test_config_names_the_optimizer(tmp_path):
    job = tiny_chat_job(tmp_path)
    with pytest.raises(ValueError, match="optim.name must be adamw or muon"):
        config_from_dict({**job, "optim": {**job["optim"], "name": "sgd"}}).validate()
    with pytest.raises(ValueError, match="optim.momentum"):
        config_from_dict({**job, "optim": {**job["optim"], "name": "muon", "momentum": 1.0}}).validate()


def _muon_job(path, **train):
    job = tiny_chat_job(path, **train)
    job["optim"] = {**job["optim"], "name": "muon", "lr": 3e-3}
    job["data"]["pack"] = True
    return job


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_training_with_muon_learns_and_the_step_graph_equals_eager(tmp_path):
    """The tiny chat job with Muon: the loss falls, and the step replayed through the CPU stand-in
    capture gives the eager losses and weights."""
    results = {}
    for mode in ("eager", "graph"):
        trainer = Trainer(config_from_dict(_muon_job(tmp_path / mode, max_steps=24)),
                          target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
        assert isinstance(trainer.optimizer, Muon)
        if mode == "graph":
            capture = dry_capture(trainer.drafter.parameters(), trainer.optimizer, extra=[trainer.step.bad])
            trainer.step.use_graph(GraphedStep(trainer.step.graph_body, trainer.optimizer, capture=capture))
        trainer.run()
        results[mode] = (_losses(tmp_path / mode / "run"), trainer.drafter.state_dict(), trainer.step.graph)
    (eager, eager_w, _), (graphed, weights, graph) = results["eager"], results["graph"]
    assert sum(eager[-4:]) < 0.8 * sum(eager[:4]), eager
    assert graph.replays >= 20
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-5, atol=1e-6)
    for name, value in eager_w.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)


def test_exact_resume_with_muon(tmp_path, monkeypatch):
    """5 steps + save + resume + 5 == 10 steps: the momentum buffers and the AdamW state come back."""
    train(config_from_dict(_muon_job(tmp_path / "full", max_steps=10)), target=tiny_chat_target(SMOLLM2),
          echo=lambda *a: None)
    first = _muon_job(tmp_path / "split", max_steps=10)
    original_run = trainer_mod.Trainer.run

    def stop_after_five(self, on_step_end=None):
        return original_run(self, lambda t: setattr(t, "stop_requested", t.counters.step == 5))

    with monkeypatch.context() as patch:
        patch.setattr(trainer_mod.Trainer, "run", stop_after_five)
        train(config_from_dict(first), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    resumed = {**first, "train": {**first["train"], "resume": "auto"}}
    train(config_from_dict(resumed), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "split" / "run")),
                               torch.tensor(_losses(tmp_path / "full" / "run")), rtol=1e-5, atol=1e-6)
