"""The serving ``config.json`` field by field, pinned where mutation testing found it unchecked (issue 60.4).

A wrong key or value in the exported config is silent: vLLM, SGLang and the authors' code read what is
there, and a drafter served with the wrong rope, layer ids or window drafts badly without an error. So:
the whole ``config.json`` of one config with every option away from its default, written out by hand;
reading it back; the fallbacks of a minimal config; both rope spellings; and the refusals word for word.
The equivalent survivors, and why: ``docs/faults.md`` (item 4).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash_train.export import serving
from dflash_train.export.serving import (
    AUX_LAYER_IDS_KEY,
    check_tensors,
    drafter_config_from_serving,
    serving_config,
    serving_tensor_names,
)
from dflash_train.models.config import DrafterConfig


def _cfg(**changes) -> DrafterConfig:
    """A resolved config with every option away from its default."""
    cfg = DrafterConfig(
        num_hidden_layers=3, block_size=8, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, rms_norm_eps=1e-5, rope_theta=50000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "rope_theta": 1.0}, max_position_embeddings=None,
        vocab_size=300, num_target_layers=12, target_layer_ids=[1, 5, 9], num_target_features=3, mask_token_id=7,
        layer_types=["full_attention", "sliding_attention", "full_attention"], sliding_window=32,
        attention_bias=True, tie_word_embeddings=True)
    return dataclasses.replace(cfg, **changes)


EXPECTED = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "auto_map": {"AutoModel": "modeling_dflash.DFlashDraftModel"},
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 50000.0,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0},
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    "max_position_embeddings": 32768,
    "vocab_size": 300,
    "tie_word_embeddings": True,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "layer_types": ["full_attention", "sliding_attention", "full_attention"],
    "sliding_window": 32,
    "use_sliding_window": True,
    "max_window_layers": 3,
    "block_size": 8,
    "num_target_layers": 12,
    "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1, 5, 9]},
    "eagle_aux_hidden_state_layer_ids": [2, 6, 10],
    "initializer_range": 0.02,
    "use_cache": True,
    "dtype": "bfloat16",
    "torch_dtype": "bfloat16",
}


def test_the_serving_config_is_written_field_by_field():
    assert serving_config(_cfg(), torch.bfloat16) == EXPECTED
    assert list(serving_config(_cfg(), torch.bfloat16)) == list(EXPECTED)  # the order a reader sees


def test_reading_the_serving_config_back_gives_the_config_in_one_spelling():
    want = _cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=32768)
    assert drafter_config_from_serving(EXPECTED) == want


def test_defaults_dtypes_and_a_window_without_sliding_layers():
    config = serving_config(_cfg(rope_theta=10000.0, rope_scaling=None, layer_types=["full_attention"] * 3,
                                 attention_bias=False, tie_word_embeddings=False, max_position_embeddings=4096),
                            torch.float16)
    assert config["rope_theta"] == 10000.0 and "rope_scaling" not in config
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert (config["sliding_window"], config["use_sliding_window"]) == (None, False)
    assert (config["attention_bias"], config["tie_word_embeddings"]) == (False, False)
    assert (config["dtype"], config["torch_dtype"], config["max_position_embeddings"]) == ("float16", "float16", 4096)
    assert serving_config(_cfg(), torch.float32)["dtype"] == "float32"
    assert serving_config(_cfg(), torch.float64)["torch_dtype"] == "float64"


def test_a_minimal_serving_config_reads_with_its_fallbacks():
    minimal = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
               "vocab_size": 300, "block_size": 8, "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1, 5]}}
    cfg = drafter_config_from_serving(minimal, num_target_layers=12)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps) == (4, 16, 1e-6)
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings) == (10000.0, None, None)
    assert cfg.layer_types == ["full_attention", "full_attention"] and cfg.sliding_window is None
    assert (cfg.attention_bias, cfg.tie_word_embeddings) == (False, False)
    assert (cfg.num_target_layers, cfg.num_target_features, cfg.target_layer_ids) == (12, 2, [1, 5])
    assert (cfg.kind, cfg.options) == ("dflash", {})


@pytest.mark.parametrize(("config", "want"), [
    ({}, (10000.0, None)),
    ({"rope_theta": 5.0e5}, (5.0e5, None)),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 2.0e4}}, (2.0e4, None)),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 2.0e4, "factor": 2.0}},
     (2.0e4, {"rope_type": "linear", "factor": 2.0})),
    ({"rope_theta": 3.0e4, "rope_parameters": {"rope_theta": 1.0}}, (3.0e4, None)),
    ({"rope_scaling": {"type": "linear", "factor": 2.0, "rope_theta": 9.0}}, (10000.0, {"type": "linear", "factor": 2.0})),
    ({"rope_scaling": {"rope_type": "default"}}, (10000.0, None)),
    ({"rope_scaling": {"type": "default", "factor": 1.0}}, (10000.0, None)),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0},
      "rope_parameters": {"rope_type": "linear", "factor": 2.0}}, (10000.0, {"rope_type": "yarn", "factor": 4.0})),
])
def test_rope_is_read_from_either_spelling(config, want):
    theta, scaling = serving._rope_from_serving(config)
    assert (theta, scaling) == want and type(theta) is float


def test_a_config_that_is_not_a_drafters_is_refused_naming_what_lacks():
    with pytest.raises(ValueError) as err:
        drafter_config_from_serving({"hidden_size": 64}, source="x/config.json")
    assert str(err.value) == "x/config.json: not a DFlash drafter config (no 'dflash_config' object)"
    with pytest.raises(ValueError) as err:
        drafter_config_from_serving({"num_hidden_layers": 2, "dflash_config": {"target_layer_ids": [1]}}, source="c")
    assert str(err.value) == ("c: missing required field(s) ['hidden_size', 'num_attention_heads', 'intermediate_size', "
                              "'vocab_size', 'block_size', 'dflash_config.mask_token_id']")


def test_vllms_layer_ids_must_be_the_target_layer_ids_plus_one():
    config = dict(EXPECTED, **{AUX_LAYER_IDS_KEY: [1, 5, 9]})
    with pytest.raises(ValueError) as err:
        drafter_config_from_serving(config, source="d/config.json")
    assert str(err.value) == ("d/config.json: eagle_aux_hidden_state_layer_ids [1, 5, 9] must be "
                              "dflash_config.target_layer_ids + 1 = [2, 6, 10]; vLLM reads it first, so it would "
                              "serve other layers")
    del config[AUX_LAYER_IDS_KEY]
    assert drafter_config_from_serving(config).target_layer_ids == [1, 5, 9]


def test_extra_config_adds_keys_and_refuses_to_change_an_exported_one():
    config = serving_config(_cfg(), torch.bfloat16, extra_config={"block_size": 8, "note": "x"})
    assert config["note"] == "x" and config["block_size"] == 8
    with pytest.raises(ValueError) as err:
        serving_config(_cfg(), torch.bfloat16, extra_config={"block_size": 16})
    assert str(err.value) == "extra_config['block_size'] = 16 conflicts with the exported value 8"


def test_an_unresolved_config_is_refused_naming_the_unset_fields():
    with pytest.raises(ValueError) as err:
        serving_config(_cfg(hidden_size=None, vocab_size=None))
    assert str(err.value) == ("drafter config is not resolved against a target (unset: ['hidden_size', 'max_position_embeddings', "
                              "'vocab_size']); "
                              "cannot export")
    with pytest.raises(ValueError) as err:
        serving_tensor_names(_cfg(intermediate_size=None, head_dim=None))
    assert str(err.value) == ("drafter config is not resolved: ['head_dim', 'intermediate_size'] unset "
                              "(resolve it against the target first)")


def test_tensor_problems_are_listed_twelve_at_most():
    cfg = _cfg()
    expected = serving_tensor_names(cfg)
    tensors = {name: torch.zeros(shape, device="meta") for name, shape in expected.items()}
    names = sorted(expected)
    for name in names[:14]:
        del tensors[name]
    first = next(iter(tensors))
    tensors[first] = torch.zeros(1, device="meta")
    tensors["extra.weight"] = torch.zeros(1, device="meta")
    with pytest.raises(ValueError) as err:
        check_tensors(tensors, cfg, "w.safetensors")
    missing = [k for k in expected if k in names[:14]]
    assert str(err.value) == (
        "w.safetensors does not match the DFlash serving layout for this config: "
        f"missing tensors: {', '.join(missing[:12])}, ... (2 more); unexpected tensors: extra.weight; "
        f"wrong shapes: {first} (1,) (expected {expected[first]})")


def test_the_rest_of_the_rope_and_head_rules():
    """``rope_type`` and a leftover ``type`` both given: one kind in the config; a scaling without a type is no
    scaling; a head size of its own is read as given, not derived from the hidden size."""
    fields = serving._rope_fields(_cfg(rope_scaling={"rope_type": "yarn", "type": "yarn", "factor": 4.0}))
    assert fields["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0}
    assert fields["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}
    assert serving._rope_from_serving({"rope_scaling": {"factor": 2.0}}) == (10000.0, None)
    assert drafter_config_from_serving(dict(EXPECTED, head_dim=32)).head_dim == 32


def test_a_listing_of_exactly_twelve_names_has_no_tail():
    names = [f"t{i}" for i in range(12)]
    assert serving._listing(names) == ", ".join(names)
    assert serving._listing([*names, "t12"]) == ", ".join(names) + ", ... (1 more)"


def test_a_kind_missing_its_fields_or_an_invalid_config_names_the_file():
    with pytest.raises(ValueError) as err:
        drafter_config_from_serving(dict(EXPECTED, architectures=["DSparkDraftModel"]), source="e/config.json")
    assert str(err.value) == "e/config.json: missing required field 'markov_rank' of a DSparkDraftModel"
    with pytest.raises(ValueError) as err:
        drafter_config_from_serving(dict(EXPECTED, layer_types=["full_attention"]), source="f/config.json")
    assert str(err.value).startswith("f/config.json: ")
