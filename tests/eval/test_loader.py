"""Loading a DFlash serving-format folder (spec section 4)."""

from __future__ import annotations

import pytest
import torch
from serving_helpers import write_serving_folder
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.decoding.speculative import speculative_generate
from dflash_train.eval.loader import load_drafter_folder
from dflash_train.models.target import Target


@pytest.fixture(scope="module")
def target():
    return Target(tiny_qwen3())


@pytest.fixture(scope="module")
def drafter_and_cfg(target):
    return tiny_drafter(target, num_layers=2, block_size=4, layer_types=["sliding_attention", "full_attention"],
                        sliding_window=8, seed=2)


def test_roundtrip_identical_outputs(tmp_path, target, drafter_and_cfg):
    drafter, cfg = drafter_and_cfg
    folder = write_serving_folder(drafter, cfg, tmp_path / "d")
    loaded = load_drafter_folder(folder, target)
    assert loaded.block_size == 4 and loaded.layer_types == cfg.layer_types and loaded.sliding_window == 8
    assert loaded.rotary_emb.inv_freq.dtype == torch.float32
    assert not any(p.requires_grad for p in loaded.parameters())
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    torch.manual_seed(0)
    embeds, feats = torch.randn(1, 4, 64), torch.randn(1, 6, 64 * len(cfg.target_layer_ids))
    args = (embeds, feats, torch.arange(6, 10)[None], torch.arange(6)[None])
    torch.testing.assert_close(loaded(*args), drafter(*args), rtol=0, atol=0)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert speculative_generate(target, loaded, ids, 12).tokens == speculative_generate(target, drafter, ids, 12).tokens


@pytest.mark.parametrize(
    "target_kw, message",
    [
        ({"hidden": 32}, "hidden_size 64 != the target's hidden size 32"),
        ({"num_layers": 4}, "num_target_layers 6 != the target's 4 layers"),
        ({"vocab": 96}, "vocab_size 128 != the target's vocab size 96"),
    ],
)
def test_mismatched_target(tmp_path, drafter_and_cfg, target_kw, message):
    drafter, cfg = drafter_and_cfg
    folder = write_serving_folder(drafter, cfg, tmp_path / "d")
    other = Target(tiny_qwen3(**target_kw))
    with pytest.raises(ValueError, match="does not fit this target") as err:
        load_drafter_folder(folder, other)
    assert message in str(err.value)
