"""GPU checks (run through the device tool): flex path numerics and a cold-cache compile.

    python -m pytest -m gpu tests/gpu -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_train.models.attention import build_masks, dense_mask, full_block_mask_mod
from dflash_train.models.drafter import attend

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("window", [None, 48])
def test_flex_forward_backward_equal_dense_on_cuda(window, packed):
    """The compiled flex BlockMask path equals the dense-mask path (itself checked
    against a brute-force loop on CPU) in forward and backward; ``packed``: rows of
    several conversations (each block sees only its own)."""
    from dflash_train.models.attention import document_layout

    torch.manual_seed(0)
    rows, seq, blocks, block = 2, 512, 32, 16
    anchors = torch.stack([torch.randperm(seq - 1)[:blocks].sort().values for _ in range(rows)]).cuda()
    keep = torch.rand(rows, blocks, device="cuda") > 0.2
    starts = None
    if packed:
        docs = torch.repeat_interleave(torch.arange(5), torch.tensor([100, 37, 200, 150, 25])).expand(rows, seq)
        starts = document_layout(docs.cuda())[0].gather(1, anchors)
    types = ["sliding_attention" if window else "full_attention"]
    flex = next(iter(build_masks("flex", types, anchors, keep, seq, block, window, starts).values()))
    dense = next(iter(build_masks("sdpa", types, anchors, keep, seq, block, window, starts).values()))
    q = torch.randn(rows, 8, blocks * block, 64, device="cuda", requires_grad=True)
    k = torch.randn(rows, 2, seq + blocks * block, 64, device="cuda", requires_grad=True)
    v = torch.randn(rows, 2, seq + blocks * block, 64, device="cuda", requires_grad=True)
    out = attend(q, k, v, flex, 0.125)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = attend(q, k, v, dense, 0.125)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)


def test_block_mask_is_sparse_and_head_independent():
    seq, blocks, block = 4096, 256, 16
    anchors = torch.randperm(seq - 1)[:blocks].sort().values.view(1, -1).cuda()
    keep = torch.ones(1, blocks, dtype=torch.bool, device="cuda")
    mask = build_masks("flex", ["full_attention"], anchors, keep, seq, block)["full_attention"]
    assert mask.kv_num_blocks.shape[1] == 1  # H = None: one mask shared by all heads
    dense = dense_mask(full_block_mask_mod(anchors, keep, seq, block), 1, blocks * block, seq + blocks * block, "cuda")
    assert mask.sparsity() > 30.0  # percent of (q, kv) tiles skipped
    assert dense.float().mean() < 0.6


@pytest.mark.skipif(not (REPO / "assets" / "smollm2" / "config.json").exists(),
                    reason="the chat test target takes assets/smollm2's tokenizer: convert it on the GPU machine first")
def test_cold_compile_cache_with_activation_checkpointing(tmp_path):
    """The failure of the system this project replaces: compiled flex_attention in a
    checkpointed drafter crashed once the inductor cache was deleted. Train a few steps
    with an empty TORCHINDUCTOR_CACHE_DIR, flex + compile + checkpointing on."""
    cache = tmp_path / "inductor-cache"
    cache.mkdir()
    script = tmp_path / "cold.py"
    script.write_text(f"""
import json, sys, time
sys.path[:0] = [{str(REPO / 'tests' / 'train')!r}, {str(REPO / 'tests')!r}]
from pathlib import Path
from test_train import job, tiny_target
from dflash_train.config import config_from_dict
from dflash_train.train.loop import train
cfg = job(Path({str(tmp_path)!r}), max_steps=6)
cfg["train"].update(device="cuda", attention="flex", compile=True, activation_checkpointing=True, num_anchors=16)
cfg["target"]["dtype"] = "bfloat16"
start = time.time()
target = tiny_target()
target.model.to("cuda", dtype=__import__("torch").bfloat16)
summary = train(config_from_dict(cfg), target=target, echo=lambda *a: None)
print("RESULT", json.dumps({{"steps": summary["steps"], "seconds": time.time() - start,
                            "first_loss": summary["first_loss"], "last_loss": summary["last_loss"]}}))
""")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    print("cold-cache run:", result)
    assert result["steps"] == 6
    assert any(cache.rglob("*")), "inductor wrote nothing: compile did not run"


def _smollm2_shaped(layers: int = 6):
    """A random Llama (SmolLM2's architecture and widths, fewer layers), float32, on CUDA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from dflash_train.models.target import Target

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                         rope_theta=100000.0, max_position_embeddings=2048)
    config._attn_implementation = "sdpa"
    return Target(LlamaForCausalLM(config).eval().cuda())


def test_target_forward_as_cuda_graph_equals_eager():
    """The trainer's replayed target forward (packed rows, real CUDA graph capture) gives the eager
    forward's features, micro-batch after micro-batch, and keeps one graph for the shape."""
    from dflash_train.train.cuda_graphs import GraphedCall

    target = _smollm2_shaped()
    layer_ids = [0, 2, 5]

    def forward(ids, docs):
        return target.features(ids, None, layer_ids, docs)

    graphed = GraphedCall(forward, "target forward")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(0, 49152, (4, 256), generator=g).cuda()
        cut = torch.randint(16, 240, (4, 1), generator=g)
        docs = torch.where(torch.arange(256)[None] < cut, torch.arange(4)[:, None], 10 + torch.arange(4)[:, None])
        docs = docs.cuda()
        torch.testing.assert_close(graphed(ids, docs), forward(ids, docs), rtol=1e-4, atol=1e-4)
    assert graphed.enabled and graphed.replays == 3 and len(graphed.graphs) == 1


@pytest.mark.parametrize(("reach_block", "weighting"), [(0, "decay"), (8, "reach"), (8, "dpace")],
                         ids=["plain", "reach", "dpace"])
def test_compiled_loss_equals_eager_on_cuda(reach_block, weighting):
    """The chunked CE through torch.compile (the trainer's default on CUDA) against the eager chunks:
    the same weighted loss, input gradient and argmax in bf16, SmolLM2's vocabulary; also with
    ``objective.weighting`` reach and dpace (blocks of 8 positions)."""
    from dflash_train.objective.loss import LossOptions, chunked_weighted_ce

    g = torch.Generator(device="cuda").manual_seed(0)
    n, h, vocab = 5000 if not reach_block else 5000 // reach_block * reach_block, 576, 49152
    # reach: a sharper head and the labels of each block's first 6 positions at the argmax (p ~ 0.37),
    # so the reach factors spread over (0, 1]
    head = (torch.randn(vocab, h, device="cuda", generator=g) * (0.2 if reach_block else 0.05)).bfloat16()
    labels = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    weights = torch.rand(n, device="cuda", generator=g)

    def make_hidden():
        x = torch.randn(n, h, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
        return x.bfloat16()

    if reach_block:
        first = torch.arange(n, device="cuda") % reach_block < reach_block - 2
        labels[first] = (make_hidden()[first] @ head.t()).argmax(-1)
    out = {}
    for compiled in (False, True):
        hidden = make_hidden().requires_grad_()
        opts = LossOptions(2048, compiled=compiled, block=reach_block, weighting=weighting)
        loss, argmax = chunked_weighted_ce(hidden, head, labels, weights, opts)
        loss.backward()
        out[compiled] = (loss.detach(), argmax, hidden.grad)
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-3, atol=1e-2)
    assert (out[True][1] == out[False][1]).float().mean() > 0.99  # bf16 near-ties may flip
    torch.testing.assert_close(out[True][2].float(), out[False][2].float(), rtol=2e-2, atol=1e-3)


@pytest.mark.skipif(not (REPO / "assets" / "smollm2" / "tokenizer.json").exists(),
                    reason="the chat test target takes assets/smollm2's tokenizer")
@pytest.mark.parametrize("pack,objective", [(True, {}), (False, {}),
                                            (True, {"loss_positions": 2, "weighting": "reach"}),
                                            (True, {"optim": "muon"}),
                                            (True, {"kind": "dflash2", "weighting": "dpace"}),
                                            (True, {"kind": "dspark", "weighting": "reach"})],
                         ids=["packed", "unpacked", "packed-k2-reach", "packed-muon", "packed-dflash2-dpace",
                              "packed-dspark-reach"])
def test_training_step_as_cuda_graph_equals_eager(tmp_path, pack, objective):
    """The trainer's whole step replayed as one CUDA graph (real capture: compiled drafter layers,
    flex_attention, the compiled loss, bf16 autocast, fused AdamW with the LR in a device tensor)
    trains as the eager step does: the same per-step losses and weights after 14 steps, with the LR
    schedule moving every step. Packed rows replay every step after the warm-up. Also with the loss
    on the first positions only and reach weighting (``objective.loss_positions``, ``weighting: reach``), with
    DFlash2 + D-PACE and DSpark (their terms and the Markov bias's gradients inside the graph), and
    with Muon (``optim.name=muon``: its Newton-Schulz iterations and device-side skip in the graph)."""
    from testkit import tiny_chat_job, tiny_chat_target

    from dflash_train.config import config_from_dict
    from dflash_train.train.trainer import Trainer

    out = {}
    objective = dict(objective)
    optimizer = objective.pop("optim", "adamw")
    kind = objective.pop("kind", "dflash")  # dflash2 / dspark: the kind's terms inside the graph too
    for graphed in (False, True):
        job = tiny_chat_job(tmp_path / str(graphed), objective, max_steps=14, device="cuda", num_anchors=16,
                            cuda_graph_step=graphed, log_every=1)
        job["data"]["pack"] = pack
        job["optim"]["name"] = optimizer
        job["drafter"]["kind"] = kind
        job["target"]["dtype"] = "bfloat16"
        target = tiny_chat_target(REPO / "assets" / "smollm2")
        target.model.to("cuda", dtype=torch.bfloat16)
        torch.manual_seed(0)
        trainer = Trainer(config_from_dict(job), target=target, echo=lambda *a: None)
        assert (trainer.step.graph is not None) == graphed
        trainer.run()
        rows = [json.loads(line) for line in (tmp_path / str(graphed) / "run" / "metrics.jsonl").read_text().splitlines()]
        out[graphed] = ([r["loss"] for r in rows if "loss" in r], [r["lr"] for r in rows if "lr" in r],
                        {k: v.float().clone() for k, v in trainer.drafter.state_dict().items()}, trainer.step.graph)
    (eager_loss, eager_lr, eager_w, _), (loss, lr, weights, graph) = out[False], out[True]
    assert graph.enabled and graph.replays >= (12 if pack else 1), graph.replays
    assert len(set(lr)) > 5 and lr == eager_lr
    torch.testing.assert_close(torch.tensor(loss), torch.tensor(eager_loss), rtol=2e-3, atol=2e-3)
    for name, value in eager_w.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("targets", [(("ce", 0.5), ("kl", 0.5)), (("ce", 0.1), ("tv", 0.9))], ids=["kl", "tv"])
def test_compiled_loss_with_distillation_and_a_logit_bias_equals_eager_on_cuda(targets):
    """The chunk with the target's distribution (kl, tv) and a trainable rank-r logit bias (DSpark's
    Markov head) through torch.compile against the eager chunks: loss and every input gradient."""
    from dflash_train.objective.loss import LossOptions, chunked_loss_parts

    g = torch.Generator(device="cuda").manual_seed(0)
    n, h, vocab, rank = 4096, 576, 49152, 64

    def inputs():
        gen = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(n, h, device="cuda", generator=gen).bfloat16().requires_grad_()
        e = (torch.randn(n, rank, device="cuda", generator=gen) * 0.1).bfloat16().requires_grad_()
        w2 = (torch.randn(vocab, rank, device="cuda", generator=gen) * 0.1).bfloat16().requires_grad_()
        return x, e, w2

    head = (torch.randn(vocab, h, device="cuda", generator=g) * 0.05).bfloat16()
    target_hidden = torch.randn(n, h, device="cuda", generator=g).bfloat16()
    labels = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    weights = torch.rand(n, device="cuda", generator=g)
    out = {}
    for compiled in (False, True):
        x, e, w2 = inputs()
        loss, argmax, _, _ = chunked_loss_parts(x, head, labels, weights, LossOptions(1024, targets, compiled),
                                                target_hidden, (e, w2))
        loss.backward()
        out[compiled] = (loss.detach(), argmax, x.grad.float(), e.grad.float(), w2.grad.float())
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-3, atol=1e-2)
    assert (out[True][1] == out[False][1]).float().mean() > 0.99
    for got, want in zip(out[True][2:], out[False][2:]):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-3)


@pytest.mark.skipif(not (REPO / "assets" / "smollm2" / "tokenizer.json").exists(),
                    reason="the chat test target takes assets/smollm2's tokenizer")
def test_feature_cache_spilled_to_host_trains_as_the_target_does(tmp_path):
    """Half the feature cache in host memory (``train.feature_cache_gib``): the prefetching thread
    gathers spilled rows into pinned memory and the step copies them asynchronously while the step
    graph replays; 30 steps (several epochs) give the losses of recomputing the target each step."""
    from testkit import tiny_chat_job, tiny_chat_target

    from dflash_train.config import config_from_dict
    from dflash_train.train.trainer import Trainer

    losses, caches = {}, {}
    for where in ("off", "spilled"):
        job = tiny_chat_job(tmp_path / where, max_steps=30, device="cuda", num_anchors=16, log_every=1,
                            feature_cache="off" if where == "off" else "device")
        job["target"]["dtype"] = "bfloat16"
        target = tiny_chat_target(REPO / "assets" / "smollm2")
        target.model.to("cuda", dtype=torch.bfloat16)
        if where == "spilled":
            probe = Trainer(config_from_dict(job), target=target, echo=lambda *a: None)
            job["train"]["feature_cache_gib"] = probe.source.gib / 2
            del probe
        torch.manual_seed(0)
        trainer = Trainer(config_from_dict(job), target=target, echo=lambda *a: None)
        trainer.run()
        rows = [json.loads(line) for line in (tmp_path / where / "run" / "metrics.jsonl").read_text().splitlines()]
        losses[where], caches[where] = [r["loss"] for r in rows if "loss" in r], trainer.source
    cache = caches["spilled"]
    assert cache.spill.shape[0] > 0 and cache.store.device.type == "cuda" and cache.hits > 0 and cache.misses > 0
    torch.testing.assert_close(torch.tensor(losses["spilled"]), torch.tensor(losses["off"]), rtol=2e-3, atol=2e-3)


def test_host_batch_copies_do_not_wait_for_the_device():
    """``to_device_async`` (the step's host -> GPU copies): with the GPU busy for ~0.2 s, copying
    pageable host tensors returns before the GPU is done (they go through pinned memory), and the
    copies are right once it is."""
    from dflash_train.devices import to_device_async

    device = torch.device("cuda")
    host = [torch.arange(3072 * k).view(k, -1) for k in (1, 2)] + [torch.rand(512) > 0.5]
    assert not any(t.is_pinned() for t in host)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e8))  # ~0.2 s of device time ahead of the copies
    copies = [to_device_async(t, device) for t in host]
    assert not torch.cuda.current_stream().query(), "a copy waited for the device"
    torch.cuda.synchronize()
    for copy, original in zip(copies, host):
        assert copy.is_cuda and torch.equal(copy.cpu(), original)
