"""A mixture-of-experts target on CUDA (tiny Qwen3-MoE; transformers' grouped_mm experts, whose
token counts per expert come from ``histc``, not a host sync): the trainer's replayed target
forward, the static eval engine's CUDA graphs, and a compiled training run.

    python -m pytest -m gpu tests/gpu/test_gpu_moe.py -q
"""

from __future__ import annotations

import math
import random
import warnings
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_drafter

from dflash_train.models.target import Target
from dflash_train.models.tiny import tiny_qwen3_moe

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


def test_moe_target_forward_as_cuda_graph_equals_eager():
    """Packed rows through the graphed bf16 MoE target: the eager features, one graph, replayed."""
    from dflash_train.train.cuda_graphs import GraphedCall

    target = Target(tiny_qwen3_moe(hidden=128, vocab=512).to("cuda", torch.bfloat16))
    assert target.model.config._experts_implementation == "grouped_mm"
    layer_ids = [1, 3]

    def forward(ids, docs):
        return target.features(ids, None, layer_ids, docs)

    graphed = GraphedCall(forward, "target forward")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(0, 511, (2, 128), generator=g).cuda()
        cut = torch.randint(16, 112, (2, 1), generator=g)
        docs = torch.where(torch.arange(128)[None] < cut, torch.arange(2)[:, None], 10 + torch.arange(2)[:, None])
        torch.testing.assert_close(graphed(ids, docs.cuda()), forward(ids, docs.cuda()))
    assert graphed.enabled and graphed.replays == 3 and len(graphed.graphs) == 1


def test_moe_static_decoding_with_cuda_graphs_equals_reference():
    """float32 (eval's lossless mode): captured verify/draft/plain steps over the MoE target decode
    exactly as the reference loops and plain greedy; a capture failure (a host sync in the
    experts) would warn and fall back, which fails here."""
    from dflash_train.decoding.speculative import speculative_generate, target_generate
    from dflash_train.decoding.static import StaticDecoder

    torch.backends.cuda.matmul.allow_tf32 = False
    target = Target(tiny_qwen3_moe(vocab=128).cuda())
    drafter, _ = tiny_drafter(target, block_size=8, seed=2)
    drafter = drafter.cuda().eval()
    decoder = StaticDecoder(target, drafter, max_len=96, mode="cudagraph")
    rng = random.Random(7)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="static eval")
        for _ in range(3):
            ids = torch.tensor([[rng.randrange(127) for _ in range(rng.randint(1, 12))]], device="cuda")
            ref = speculative_generate(target, drafter, ids, 32)
            out = decoder.speculative(ids, 32)
            assert out.tokens == ref.tokens == target_generate(target, ids, 32).tokens
            assert out.acceptance_lengths == ref.acceptance_lengths
    graphs = (decoder.verify_step, decoder.draft_step)
    assert all(step.use_graph and step.graph is not None for step in graphs)


@pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="needs assets/smollm2's tokenizer")
def test_moe_target_trains_compiled_with_flex_and_graphs(tmp_path):
    """The GPU training path (flex attention, compiled drafter, graphed target forward and step)
    over a bf16 MoE target: it runs and the loss stays finite and falls."""
    from transformers import AutoTokenizer

    from dflash_train.config import config_from_dict
    from dflash_train.train.loop import train

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    model = tiny_qwen3_moe(vocab=len(tokenizer), tie=True)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.5)
    target = Target(model.to("cuda", torch.bfloat16), tokenizer)
    cfg = tiny_chat_job(tmp_path, device="cuda", attention="flex", compile=True, max_steps=24, num_anchors=16)
    cfg["target"]["dtype"] = "bfloat16"
    summary = train(config_from_dict(cfg), target=target, echo=lambda *a: None)
    assert summary["steps"] == 24 and math.isfinite(summary["last_loss"])
    assert summary["last_loss"] < summary["first_loss"]
