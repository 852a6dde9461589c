"""DSpark (drafter.kind=dspark): the Markov walk against a slow loop, the loss with the Markov bias and
the confidence BCE against full-logits references, lossless decoding in every engine, training
with exact resume on the CPU, and the serving folder (config keys, tensor names, round trips)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from testkit import tiny_chat_job, tiny_chat_target, tiny_drafter, tiny_qwen3, train_stopped_then_resumed

from dflash_train.config import config_from_dict
from dflash_train.decoding.choosers.dspark import MarkovChooser
from dflash_train.decoding.core import GREEDY, Sampling, block_chooser
from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.export.serving import export_drafter, load_drafter_folder, serving_tensor_names
from dflash_train.models.config import DrafterConfig
from dflash_train.models.kinds.dspark import markov_walk
from dflash_train.models.target import Target
from dflash_train.objective.kinds import terms_of
from dflash_train.objective.loss import LossOptions, dflash_loss
from dflash_train.train.loop import train

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
OPTIONS = {"markov_rank": 8}


def _dspark(target, perturb=True, **kw):
    """A DSpark drafter whose Markov head is far from zero (as after training), unless ``perturb`` is off."""
    kw.setdefault("target_layer_ids", [0, 2])
    drafter, cfg = tiny_drafter(target, num_layers=2, block_size=4, kind="dspark", options=OPTIONS, **kw)
    with torch.no_grad():
        if perturb:
            drafter.markov_head.markov_w2.weight.normal_(std=2.0)
        else:
            drafter.markov_head.markov_w2.weight.zero_()
    return drafter.eval(), cfg


@pytest.fixture(scope="module")
def pair():
    target = Target(tiny_qwen3(num_layers=4))
    return target, _dspark(target)[0]


def _prompts(n=3):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 120, (1, 7), generator=g) for _ in range(n)]


def slow_walk(w1, w2, logits, anchor, temperature=0.0, generator=None):
    """The chain by hand, one slot and one token at a time: bias = W2 @ W1[prev]."""
    prev, path, rows = int(anchor), [], []
    for slot in range(logits.shape[0]):
        row = logits[slot].double() + (w2.double() @ w1[prev].double())
        if temperature > 0:
            q = torch.softmax(row / temperature, -1)
            prev = int(torch.multinomial(q.float(), 1, generator=generator))
        else:
            prev = int(row.argmax())
        path.append(prev)
        rows.append(row)
    return path, torch.stack(rows)


def test_the_walk_equals_a_slow_loop_greedy_and_sampled(pair):
    _, drafter = pair
    markov = drafter.markov_head
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 128, generator=g)
    path, rows, q = markov_walk(markov, logits[None], torch.tensor([5]))
    want, want_rows = slow_walk(markov.markov_w1.weight, markov.markov_w2.weight, logits, 5)
    assert path[0].tolist() == want and q is None
    torch.testing.assert_close(rows[0].double(), want_rows, rtol=1e-5, atol=1e-5)
    assert want != logits.argmax(-1).tolist()  # the bias moved the drafts: the check is not trivial
    sampled, _, q = markov_walk(markov, logits[None], torch.tensor([5]), 0.8, torch.Generator().manual_seed(3))
    ref, _ = slow_walk(markov.markov_w1.weight, markov.markov_w2.weight, logits, 5, 0.8,
                       torch.Generator().manual_seed(3))
    assert sampled[0].tolist() == ref and torch.allclose(q.sum(-1), torch.ones(1, 3))


def test_the_engines_choose_with_the_markov_chain(pair):
    _, drafter = pair
    chooser = block_chooser(drafter)
    assert isinstance(chooser, MarkovChooser)
    g = torch.Generator().manual_seed(1)
    hidden, logits = torch.randn(3, 64, generator=g), torch.randn(3, 128, generator=g)
    greedy = chooser(hidden, logits, torch.tensor([5]), GREEDY)
    assert greedy.tokens.tolist() == markov_walk(drafter.markov_head, logits[None], torch.tensor([5]))[0][0].tolist()
    sampled = chooser(hidden, logits, torch.tensor([5]), Sampling(temperature=0.7, generator=torch.Generator()))
    assert sampled.q.shape == logits.shape and torch.allclose(sampled.q.sum(-1), torch.ones(3))


def test_an_untrained_dspark_drafts_what_dflash_drafts():
    """markov_w2 starts at zero (its own init): no bias, so the chain is every slot's argmax."""
    from dflash_train.models.kinds.dspark import MarkovHead

    assert not MarkovHead(16, 4).markov_w2.weight.any()
    target = Target(tiny_qwen3(num_layers=4))
    spark, _ = _dspark(target, perturb=False)
    plain, _ = tiny_drafter(target, num_layers=2, block_size=4, target_layer_ids=[0, 2])
    plain.load_state_dict({k: v for k, v in spark.state_dict().items() if not k.startswith(spark.head_names[0])
                           and "confidence" not in k})
    for prompt in _prompts(2):
        a = speculative_generate(target, spark.eval(), prompt, max_new_tokens=16)
        b = speculative_generate(target, plain.eval(), prompt, max_new_tokens=16)
        assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths


def test_greedy_dspark_is_lossless_in_the_reference_and_static_engines(pair):
    target, drafter = pair
    decoder = StaticDecoder(target, drafter, max_len=64, mode="eager")
    for prompt in _prompts():
        ref = speculative_generate(target, drafter, prompt, max_new_tokens=20)
        assert ref.tokens == target_generate(target, prompt, max_new_tokens=20).tokens
        out = decoder.speculative(prompt, 20)
        assert out.tokens == ref.tokens and out.acceptance_lengths == ref.acceptance_lengths


def _loss_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    rows, num_blocks, block, hidden, vocab, rank = 2, 3, 5, 16, 50, 4
    h = torch.randn(rows, num_blocks * block, hidden, generator=g, dtype=torch.float64)
    head = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    labels = torch.randint(0, vocab, (rows, num_blocks, block), generator=g)
    valid = torch.rand(rows, num_blocks, block, generator=g) > 0.2
    valid[..., 0] = False
    weights = torch.exp(-(torch.arange(block) - 1.0) / 3.0).double() * valid
    anchors = torch.randint(0, vocab, (rows, num_blocks), generator=g)
    return h, head, labels, weights, valid, anchors, rank


class _Drafter(torch.nn.Module):
    """The heads alone (the terms read them off the drafter)."""

    def __init__(self, vocab, hidden, rank):
        super().__init__()
        from dflash_train.models.kinds.dspark import ConfidenceHead, MarkovHead

        self.markov_head = MarkovHead(vocab, rank).double()
        self.confidence_head = ConfidenceHead(hidden, rank).double()
        with torch.no_grad():
            self.markov_head.markov_w2.weight.normal_(std=0.5)
            self.confidence_head.proj.weight.normal_(std=0.5)


def test_the_loss_with_the_markov_bias_and_the_confidence_bce_equals_full_logits():
    """Chunked (the bias one chunk at a time, its gradient computed in the chunks) against the
    unchunked loss on logits + W2 W1[prev], prev teacher-forced (anchor, then the labels), plus
    the confidence BCE against the biased argmax: loss and every gradient."""
    h, head, labels, weights, valid, anchors, rank = _loss_case()
    rows, num_blocks, block = labels.shape
    drafter = _Drafter(head.shape[0], h.shape[-1], rank)
    h = h.requires_grad_()
    out = dflash_loss(h, head, labels, weights, valid, LossOptions(chunk_size=7), None, None, terms_of("dspark"),
                      drafter, anchors, {"confidence_weight": 0.5})
    params = [h, *drafter.parameters()]
    grads = torch.autograd.grad(out.weighted_ce, params)

    ref_drafter = _Drafter(head.shape[0], h.shape[-1], rank)
    ref_drafter.load_state_dict(drafter.state_dict())
    h_ref = h.detach().clone().requires_grad_()
    states = h_ref.view(rows, num_blocks, block, -1)[:, :, 1:]
    prev = torch.cat([anchors[..., None], labels[:, :, 1:-1]], -1)
    w1, w2 = ref_drafter.markov_head.markov_w1.weight, ref_drafter.markov_head.markov_w2.weight
    logits = states @ head.t() + F.embedding(prev, w1) @ w2.t()
    ce = F.cross_entropy(logits.flatten(0, -2), labels[:, :, 1:].flatten(), reduction="none").view_as(prev)
    w = weights[..., 1:]
    right = (logits.argmax(-1) == labels[:, :, 1:]).double()
    conf = ref_drafter.confidence_head.proj(torch.cat([states, F.embedding(prev, w1)], -1)).squeeze(-1)
    bce = F.binary_cross_entropy_with_logits(conf, right, reduction="none")
    ref = (ce * w).sum() + 0.5 * (bce * w).sum()
    ref_grads = torch.autograd.grad(ref, [h_ref, *ref_drafter.parameters()])
    torch.testing.assert_close(out.weighted_ce.double(), ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    assert grads[3].abs().sum() > 0  # W2's gradient is there (the bias is trained)
    assert torch.equal(out.correct, (logits.argmax(-1) == labels[:, :, 1:]) & valid[..., 1:])
    assert set(out.logs) == {"confidence_bce", "confidence_accuracy"}


def test_config_checks():
    with pytest.raises(ValueError, match="drafter.options.markov_rank must be a positive integer"):
        DrafterConfig(kind="dspark", options={"markov_rank": 0}).validate()
    with pytest.raises(ValueError, match="not options of drafter.kind=dspark"):
        DrafterConfig(kind="dspark", options={"selector_top_k": 4}).validate()
    job = config_from_dict({"target": {"path": "t"}, "data": {"paths": ["x"]}, "drafter": {"kind": "dspark"},
                            "objective": {"kind": {"confidence_weight": -1}}})
    with pytest.raises(ValueError, match="objective.kind.confidence_weight"):
        job.validate()


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def _job(tmp_path, **train_keys):
    job = tiny_chat_job(tmp_path, {"targets": {"ce": 0.5, "tv": 0.5}}, **train_keys)
    job["drafter"].update({"kind": "dspark", "options": {"markov_rank": 16}})
    return job


def test_dspark_learns_and_resumes_exactly(tmp_path):
    """Through the ordinary trainer on the CPU, with DSpark's kind of objective (CE + TV to the
    target): the loss falls; 8 steps, a stop, a resume and 8 more give the same losses as 16."""
    full = tmp_path / "full"
    summary = train(config_from_dict(_job(full)), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    curve = _losses(full / "run")
    assert len(curve) == 16 and summary["steps"] == 16
    assert sum(curve[-4:]) / 4 < 0.8 * sum(curve[:4]) / 4, curve
    resolved = json.loads((full / "run" / "config.json").read_text())["drafter_resolved"]
    assert resolved["kind"] == "dspark" and resolved["options"] == {"markov_rank": 16, "confidence_head": True}

    split = tmp_path / "split"
    train_stopped_then_resumed(_job(split, max_steps=16), 8, lambda: tiny_chat_target(SMOLLM2))
    torch.testing.assert_close(torch.tensor(_losses(split / "run")), torch.tensor(curve), rtol=1e-5, atol=1e-6)


def test_serving_folder_keys_tensors_and_round_trips(tmp_path):
    """What vLLM, SGLang and llama.cpp's converter read: the architecture, the rank, the head type,
    the 1 + N block layout; the Markov and confidence tensors by their engine names; our loader and
    AutoModel build the same network, and the exported model's own decoder is lossless."""
    from transformers import AutoModel

    hf_target = tiny_qwen3(num_layers=4)
    target = Target(hf_target)
    drafter, cfg = _dspark(target)
    out = export_drafter(drafter, cfg, tmp_path / "e", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DSparkDraftModel"]
    assert config["auto_map"] == {"AutoModel": "modeling_dflash.DSparkDraftModel"}
    assert (config["markov_rank"], config["markov_head_type"], config["sample_from_anchor"]) == (8, "vanilla", False)
    assert config["dspark_config"]["markov_rank"] == 8 and config["has_confidence_head"] is True
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert set(shapes) == set(serving_tensor_names(cfg))
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    assert shapes["markov_head.markov_w1.weight"] == (vocab, 8) and shapes["markov_head.markov_w2.weight"] == (vocab, 8)
    assert shapes["confidence_head.proj.weight"] == (1, hidden + 8) and shapes["confidence_head.proj.bias"] == (1,)

    loaded, cfg2 = load_drafter_folder(out, target)
    assert cfg2.kind == "dspark" and cfg2.options == {"markov_rank": 8, "confidence_head": True}
    g = torch.Generator().manual_seed(2)
    args = (torch.randn(1, 8, hidden, generator=g), torch.randn(1, 6, 2 * hidden, generator=g),
            torch.arange(6, 14)[None], torch.arange(6)[None])
    with torch.no_grad():
        want = drafter(*args)
        torch.testing.assert_close(loaded(*args), want, rtol=0, atol=0)
        model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True,
                                                dtype=torch.float32)
        assert type(model).__name__ == "DSparkDraftModel" and not info["missing_keys"] and not info["unexpected_keys"]
        torch.testing.assert_close(model.eval()(*args), want, rtol=0, atol=1e-6)
    prompt = torch.tensor([[3, 17, 9, 41, 5, 77]])
    got = model.spec_generate(hf_target, prompt, max_new_tokens=12, stop_token_ids=None, temperature=0.0)
    plain = hf_target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, plain[:, : got.shape[1]]) and got.shape[1] == prompt.shape[1] + 12
    stats = model.spec_generate(hf_target, prompt, max_new_tokens=12, stop_token_ids=None, temperature=0.0,
                                return_stats=True)
    ours = speculative_generate(target, loaded.eval(), prompt, max_new_tokens=12)
    assert stats.acceptance_lengths == ours.acceptance_lengths  # the same drafts: the Markov chain


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_the_compiled_draft_step_drafts_the_kinds_walk(kind):
    """The static engine's draft step through torch.compile (Inductor's CPU backend; on CUDA the same
    step is captured in a graph): the kind's chooser traced into it must draft what the reference
    loop drafts, step for step, and stay lossless. Warnings are errors: a compile failure would
    otherwise fall back silently to the eager step."""
    import warnings

    target = Target(tiny_qwen3(num_layers=4, hidden=32, vocab=128))
    options = OPTIONS if kind == "dspark" else {"conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    drafter, _ = tiny_drafter(target, num_layers=1, block_size=4, target_layer_ids=[0, 2], kind=kind,
                              options=options)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "markov_w2" in name or "codebook" in name:
                p.normal_(std=1.5)
    drafter.eval()
    decoder = StaticDecoder(target, drafter, max_len=48, compile=True, compile_steps=("draft",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for prompt in _prompts(2):
            ref = speculative_generate(target, drafter, prompt, max_new_tokens=12)
            out = decoder.speculative(prompt, 12)
            assert out.tokens == ref.tokens == target_generate(target, prompt, max_new_tokens=12).tokens
            assert out.acceptance_lengths == ref.acceptance_lengths
    assert decoder.draft_step.compiled and decoder.draft_step.warm
