"""``target.compile`` (``train/parallelize.apply_target_compile``) on the CPU (Inductor's C++ backend):
the compiled target gives the eager target's features, for plain and packed rows, for a dense, an MoE
and an FP8 (emulated) target; one graph serves every layer and nothing recompiles on later calls."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from dflash_train.config import TargetConfig
from dflash_train.models.target import Target
from dflash_train.models.tiny import tiny_qwen3, tiny_qwen3_moe
from dflash_train.train.parallelize import apply_target_compile, compile_target_if

LAYERS = [1, 3, 4]


def _inputs():
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 24))
    doc_ids = torch.tensor([[0] * 9 + [1] * 15, [0] * 24])  # packed: two conversations in row 0
    return ids, doc_ids


@pytest.mark.parametrize("kind", ["dense", "moe", "fp8"])
def test_compiled_target_gives_eager_features_with_one_graph(kind):
    torch._dynamo.reset()
    counters.clear()
    model = tiny_qwen3_moe(num_layers=6) if kind == "moe" else tiny_qwen3(num_layers=6)
    target = Target(model)
    if kind == "fp8":
        target.use_fp8_linears(emulate=True)
    ids, doc_ids = _inputs()
    eager_plain = target.features(ids, None, LAYERS)
    eager_packed = target.features(ids, None, LAYERS, doc_ids=doc_ids)

    apply_target_compile(target)
    apply_target_compile(target)  # idempotent: the launcher and the trainer may both ask
    assert all(getattr(layer.forward, "__wrapped__", None) is not None for layer in target.layers)
    for _ in range(2):  # the second round must reuse the graphs (the hooks change at every call)
        torch.testing.assert_close(target.features(ids, None, LAYERS), eager_plain, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(target.features(ids, None, LAYERS, doc_ids=doc_ids), eager_packed,
                                   atol=2e-5, rtol=1e-4)
    # one graph for every layer, a second for packed rows (their mask is a tensor, not None)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])
    # the parameters keep their names (checkpoints and the drafter's handles read them)
    assert "model.layers.0.self_attn.o_proj.weight" in dict(model.named_parameters()) or kind == "fp8"


def test_compile_target_if_follows_the_device():
    target = Target(tiny_qwen3(num_layers=2))
    assert not compile_target_if(target, TargetConfig(path="x", compile=True), torch.device("cpu"))
    assert not compile_target_if(target, TargetConfig(path="x", compile=False), torch.device("cuda"))
    assert not getattr(target, "layers_compiled", False)


def test_target_compile_must_be_a_bool():
    with pytest.raises(ValueError, match="target.compile must be true or false"):
        TargetConfig(path="x", compile="yes").validate()
