"""``target.compile`` on CUDA: the compiled target's features equal the eager ones (bf16 and FP8), inside
the trainer's CUDA graph of the target forward too, and a training run with it matches one without.

    python -m pytest -m gpu tests/gpu/test_gpu_target_compile.py -q
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job

from dflash_train.models.target import Target
from dflash_train.models.tiny import tiny_qwen3
from dflash_train.train.parallelize import apply_target_compile

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


def _packed(g, rows=4, seq=256, vocab=49152):
    ids = torch.randint(0, vocab, (rows, seq), generator=g).cuda()
    cut = torch.randint(16, seq - 16, (rows, 1), generator=g)
    docs = torch.where(torch.arange(seq)[None] < cut, torch.arange(rows)[:, None], 10 + torch.arange(rows)[:, None])
    return ids, docs.cuda()


def _smollm2_shaped_bf16(layers: int = 6) -> Target:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                         rope_theta=100000.0, max_position_embeddings=2048)
    config._attn_implementation = "sdpa"
    return Target(LlamaForCausalLM(config).eval().to("cuda", torch.bfloat16))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_compiled_target_in_a_cuda_graph_equals_eager(fp8):
    """bf16 (and FP8, whose quantization is now fused by Inductor): packed rows through the compiled
    layers, replayed as the trainer's CUDA graph, against the eager target. Fusion reorders bf16
    arithmetic, so the check is a relative error, not bit equality. FP8: fused, the activation is
    quantized from the norm's unrounded output, so some elements land on the neighbouring e4m3 value;
    the compiled FP8 target must sit as close to the bf16 target as the eager FP8 one does."""
    from dflash_train.train.cuda_graphs import GraphedCall

    target = _smollm2_shaped_bf16()
    layer_ids = [0, 2, 5]
    g = torch.Generator().manual_seed(0)
    batches = [_packed(g) for _ in range(3)]
    bf16 = [target.features(ids, None, layer_ids, docs).float() for ids, docs in batches]
    if fp8:
        target.use_fp8_linears()
    eager = [target.features(ids, None, layer_ids, docs).float() for ids, docs in batches]
    apply_target_compile(target)
    graphed = GraphedCall(lambda ids, docs: target.features(ids, None, layer_ids, docs), "target forward")
    for (ids, docs), ref, base in zip(batches, eager, bf16):
        out = graphed(ids, docs).float()
        rel = float((out - ref).norm() / ref.norm())
        if not fp8:
            assert rel < 1e-2, rel
            continue
        eager_error, compiled_error = (float((x - base).norm() / base.norm()) for x in (ref, out))
        assert compiled_error < 1.25 * eager_error + 1e-3, (compiled_error, eager_error, rel)
        assert rel < 2 * eager_error, (rel, eager_error)
    assert graphed.enabled and graphed.replays == 3 and len(graphed.graphs) == 1, (graphed.enabled, graphed.replays)


def test_training_with_a_compiled_target_tracks_the_eager_one(tmp_path):
    """The trainer with ``target.compile`` (and its CUDA-graphed target forward): 24 steps whose losses
    follow the run without it (same seed and batches; bf16 fusion differences only)."""
    from transformers import AutoTokenizer

    from dflash_train.config import config_from_dict
    from dflash_train.train.loop import train

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    losses = {}
    for compiled in (False, True):
        model = tiny_qwen3(vocab=len(tokenizer), tie=True)
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, 0.5)
        target = Target(model.to("cuda", torch.bfloat16), tokenizer)
        cfg = tiny_chat_job(tmp_path / str(compiled), device="cuda", attention="flex", compile=True, max_steps=24,
                            num_anchors=16)
        cfg["target"].update(dtype="bfloat16", compile=compiled)
        summary = train(config_from_dict(cfg), target=target, echo=lambda *a: None)
        assert getattr(target, "layers_compiled", False) == compiled
        assert summary["steps"] == 24 and math.isfinite(summary["last_loss"])
        losses[compiled] = (summary["first_loss"], summary["last_loss"])
    assert losses[True][0] == pytest.approx(losses[False][0], rel=2e-2)
    assert losses[True][1] == pytest.approx(losses[False][1], rel=5e-2)
    assert losses[True][1] < losses[True][0]
