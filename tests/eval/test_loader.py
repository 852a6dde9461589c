"""Loading a DFlash serving-format folder (spec section 4)."""

from __future__ import annotations

import json

import pytest
import torch
from serving_helpers import write_serving_folder

from dflash_train.eval.loader import load_drafter_folder, read_drafter_config
from dflash_train.eval.speculative import speculative_generate
from dflash_train.models.target import Target
from dflash_train.testing import tiny_drafter, tiny_qwen3


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


def test_reads_spec_fields(tmp_path, target, drafter_and_cfg):
    drafter, cfg = drafter_and_cfg
    folder = write_serving_folder(drafter, cfg, tmp_path / "d", config_overrides={
        "rope_theta": None, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})
    read = read_drafter_config(folder)
    assert read.target_layer_ids == cfg.target_layer_ids and read.mask_token_id == cfg.mask_token_id
    assert read.rope_theta == 10000.0 and read.rope_scaling is None
    assert read.head_dim == cfg.head_dim and read.num_key_value_heads == cfg.num_key_value_heads


@pytest.mark.parametrize(
    "target_kw, message",
    [
        ({"hidden": 32}, "hidden_size 64 != the target's 32"),
        ({"num_layers": 4}, "num_target_layers 6 != the target's 4 layers"),
        ({"vocab": 96}, "vocab_size 128 != the target's 96"),
    ],
)
def test_mismatched_target(tmp_path, drafter_and_cfg, target_kw, message):
    drafter, cfg = drafter_and_cfg
    folder = write_serving_folder(drafter, cfg, tmp_path / "d")
    other = Target(tiny_qwen3(**target_kw))
    with pytest.raises(ValueError, match="does not match the target") as err:
        load_drafter_folder(folder, other)
    assert message in str(err.value)


def test_layer_ids_and_mask_out_of_range(tmp_path, target, drafter_and_cfg):
    drafter, cfg = drafter_and_cfg
    folder = write_serving_folder(drafter, cfg, tmp_path / "d", config_overrides={
        "num_target_layers": None, "vocab_size": None,
        "dflash_config": {"mask_token_id": 500, "target_layer_ids": [1, 9]}})
    with pytest.raises(ValueError) as err:
        load_drafter_folder(folder, target)
    assert "target_layer_ids [9] out of range" in str(err.value)
    assert "mask_token_id 500" in str(err.value)


def test_bad_tensors(tmp_path, target, drafter_and_cfg):
    drafter, cfg = drafter_and_cfg
    folder = write_serving_folder(drafter, cfg, tmp_path / "a", drop=("fc.weight",))
    with pytest.raises(ValueError, match=r"missing \['fc.weight'\]"):
        load_drafter_folder(folder, target)
    folder = write_serving_folder(drafter, cfg, tmp_path / "b", config_overrides={"intermediate_size": 100})
    with pytest.raises(ValueError, match="tensor shapes do not match config.json: layers.0.mlp.gate_proj.weight"):
        load_drafter_folder(folder, target)


def test_not_a_dflash_folder(tmp_path, target, drafter_and_cfg):
    drafter, cfg = drafter_and_cfg
    with pytest.raises(FileNotFoundError):
        load_drafter_folder(tmp_path / "nope", target)
    folder = write_serving_folder(drafter, cfg, tmp_path / "d")
    config = json.loads((folder / "config.json").read_text())
    del config["dflash_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing .*dflash_config"):
        load_drafter_folder(folder, target)
    (folder / "config.json").write_text(json.dumps({**config, "dflash_config": {"mask_token_id": 1,
                                                                                 "target_layer_ids": [1]}}))
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_drafter_folder(folder, target)
