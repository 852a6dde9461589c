"""The whole training step replayed as one CUDA graph (train/cuda_graphs.GraphedStep), with a CPU
stand-in for the capture that behaves like CUDA's (``testing.dry_capture``): capturing records the
step WITHOUT running it (the state it touched is put back), and each replay runs it on the static
buffers, overwrites the gradients (zeroed in place first, not accumulated) and writes the outputs IN
PLACE, so a missing clone, a stale input buffer, a stale learning rate or a double step changes the
numbers. The reference is the plain eager step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from testkit import dry_capture, tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict
from dflash_train.train import trainer as trainer_mod
from dflash_train.train.assembly import Assembled
from dflash_train.train.cuda_graphs import GraphedStep
from dflash_train.train.loop import train
from dflash_train.train.trainer import Trainer

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


def _toy(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(6, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))  # changes every step
    return model, optimizer, scheduler


def _body(model, optimizer):
    def body(inputs, context, step_number):
        (x,) = inputs
        loss = ((model(x) - context) ** 2).mean() + 0 * step_number
        loss.backward()
        optimizer.step()
        return loss.detach(), (x.sum(),)

    return body


def _batches():
    g = torch.Generator().manual_seed(1)
    shapes = [(4, 6)] * 4 + [(2, 6)] + [(4, 6)] * 3  # one step of another shape runs eagerly
    return [(torch.randn(s, generator=g), torch.randn(s[0], 3, generator=g)) for s in shapes]


def _eager_reference():
    model, optimizer, scheduler = _toy()
    losses = []
    for x, y in _batches():
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.detach())
    return torch.stack(losses), model


def test_replayed_steps_equal_eager_steps():
    want, reference = _eager_reference()
    model, optimizer, scheduler = _toy()
    graphed = GraphedStep(_body(model, optimizer), optimizer, eager_steps=2,
                          capture=dry_capture(model.parameters(), optimizer))
    results = []
    for step, (x, y) in enumerate(_batches(), start=1):
        results.append(graphed((x,), y, step))
        scheduler.step()
    torch.testing.assert_close(torch.stack([loss for loss, _ in results]), want)  # earlier outputs survive
    assert graphed.replays == 5 and graphed.graph is not None  # 2 eager, 1 other shape, 5 replays
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    torch.testing.assert_close(results[0][1][0], _batches()[0][0].sum())


def test_a_capture_failure_warns_once_and_trains_eagerly():
    want, reference = _eager_reference()
    model, optimizer, scheduler = _toy()

    def broken(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphed = GraphedStep(_body(model, optimizer), optimizer, eager_steps=1, capture=broken)
    losses = []
    with pytest.warns(UserWarning, match="capture failed") as warned:
        for step, (x, y) in enumerate(_batches(), start=1):
            losses.append(graphed((x,), y, step)[0])
            scheduler.step()
    assert len(warned) == 1 and not graphed.enabled
    torch.testing.assert_close(torch.stack(losses), want)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize(("pack", "kind", "objective"), [(True, "dflash", {}), (False, "dflash", {}),
                                                     (True, "dflash2", {"weighting": "dpace"}),
                                                     (True, "dspark", {"weighting": "reach"})],
                         ids=["packed", "unpacked", "packed-dflash2-dpace", "packed-dspark-reach"])
def test_training_with_the_step_graph_equals_eager_training(tmp_path, pack, kind, objective):
    """The tiny chat job, 12 steps: the same losses step for step and the same weights at the end.
    Packed rows have one shape (every step after the warm-up replays); unpacked ones vary (steps of
    another shape run eagerly between replays). Also a DFlash2 drafter with D-PACE (the selector's
    CE and the D-PACE weights inside the replayed step), and a DSpark drafter with reach weighting (the
    Markov bias's gradients and the confidence BCE inside it; kl/tv targets never graph: their
    features are a pair)."""
    results = {}
    for mode in ("eager", "graph"):
        job = tiny_chat_job(tmp_path / mode, objective, max_steps=12)
        job["data"]["pack"] = pack
        job["drafter"]["kind"] = kind
        trainer = Trainer(config_from_dict(job), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
        assert trainer.step.graph is None  # on the CPU the trainer does not graph the step
        if mode == "graph":
            capture = dry_capture(trainer.drafter.parameters(), trainer.optimizer, extra=[trainer.step.bad])
            trainer.step.use_graph(GraphedStep(trainer.step.graph_body, trainer.optimizer, capture=capture))
        trainer.run()
        results[mode] = (_losses(tmp_path / mode / "run"), {k: v.clone() for k, v in trainer.drafter.state_dict().items()},
                         trainer.step.graph)
    (eager_losses, eager_weights, _), (losses, weights, graph) = results["eager"], results["graph"]
    assert graph.replays >= (9 if pack else 1), graph.replays
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-5, atol=1e-6)
    for name, value in eager_weights.items():
        if "codebook" in name or "markov" in name:  # [vocab, r] tables: DFlash2's codebooks, DSpark's W1 and W2
            # the codebooks' rows of tokens seen once get near-zero gradients, which Adam's m / sqrt(v)
            # turns into full-size updates: a summation-order difference there moves a few elements
            # by ~1e-6 (measured: 1 of 12.6M elements, 1.3e-6). Everything else matches as tightly.
            off = ((weights[name] - value).abs() > 1e-6 + 1e-5 * value.abs()).sum().item()
            assert off <= 8 and (weights[name] - value).abs().max() < 1e-4, (name, off)
            continue
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)


def _graph_every_step(monkeypatch):
    """Trainers built by ``train()`` replay their steps through the CPU stand-in capture."""
    made = []

    original = Assembled.graph_step

    def graphed(self, step, ranks, data_parallel, echo=None, capture=None):
        capture = dry_capture(self.drafter.parameters(), step.optimizer, extra=[step.bad])
        assert original(self, step, ranks, data_parallel, capture=capture)  # the assembly's own rule
        made.append(step.graph)
        return True

    monkeypatch.setattr(Assembled, "graph_step", graphed)
    return made


def test_exact_resume_with_the_step_graph(tmp_path, monkeypatch):
    """5 graphed steps + save + resume (a new graph, captured after the checkpoint is loaded) + 5
    more == 10 eager steps, loss for loss."""
    job = tiny_chat_job(tmp_path / "eager", max_steps=10)
    job["data"]["pack"] = True
    train(config_from_dict(job), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    reference = _losses(tmp_path / "eager" / "run")
    made = _graph_every_step(monkeypatch)
    first = tiny_chat_job(tmp_path / "split", max_steps=10)
    first["data"]["pack"] = True
    original_run = trainer_mod.Trainer.run

    def stop_after_five(self, on_step_end=None):  # as a SIGTERM would: finish step 5, save, end
        return original_run(self, lambda t: setattr(t, "stop_requested", t.counters.step == 5))

    with monkeypatch.context() as patch:
        patch.setattr(trainer_mod.Trainer, "run", stop_after_five)
        train(config_from_dict(first), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    resumed = {**first, "train": {**first["train"], "resume": "auto"}}
    train(config_from_dict(resumed), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    assert [g.replays for g in made] == [3, 3]
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "split" / "run")), torch.tensor(reference),
                               rtol=1e-5, atol=1e-6)


def test_a_non_finite_replayed_step_is_skipped_on_the_device(tmp_path, monkeypatch):
    """NaN features at step 6 (a replay): no update at all that step, the device counters in ``bad``
    (written by the graph in place) report it, and the run goes on within train.max_bad_steps."""
    from dflash_train.train.features import LocalFeatures

    made = _graph_every_step(monkeypatch)
    original, calls = LocalFeatures.features, []

    def features(self, micro_batch, input_ids, attention_mask):
        calls.append(1)
        out = original(self, micro_batch, input_ids, attention_mask)
        return out * float("nan") if len(calls) == 6 else out

    monkeypatch.setattr(LocalFeatures, "features", features)
    weights = []
    job = tiny_chat_job(tmp_path, max_steps=8, max_bad_steps=1)
    job["data"]["pack"] = True
    said = []
    trainer = Trainer(config_from_dict(job), target=tiny_chat_target(SMOLLM2), echo=lambda *a: said.append(a[0]))
    trainer.run(on_step_end=lambda t: weights.append([p.detach().clone() for p in t.drafter.parameters()]))
    assert made[0].replays == 6 and trainer.counters.bad_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(weights[4], weights[5]))  # step 6 changed nothing
    assert not all(torch.equal(a, b) for a, b in zip(weights[5], weights[6]))  # step 7 trained again
    assert any("skipped 1 step(s)" in line and "step 6" in line for line in said)
