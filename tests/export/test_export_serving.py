"""Spec 4: the serving folder that ``export`` writes, and reading it back."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflash_train.export.serving import (
    MODELING_FILE,
    export_drafter,
    load_drafter_folder,
    serving_tensor_names,
)
from dflash_train.models.attention import build_masks
from dflash_train.models.config import DrafterConfig
from dflash_train.models.target import Target

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_spec = importlib.util.spec_from_file_location("_dflash_root_conftest", Path(__file__).parents[1] / "conftest.py")
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
tiny_qwen3, tiny_drafter = _root.tiny_qwen3, _root.tiny_drafter
SMOLLM2 = _root.SMOLLM2
DRAFTER_SOURCE = Path(__file__).parents[2] / "src" / "dflash_train" / "models" / "drafter.py"

VARIANTS = {
    "plain": {},
    "sliding_bias_scaled": dict(
        num_layers=3,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        sliding_window=3,
        attention_bias=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        num_target_features=3,
    ),
    "own_shape": dict(num_attention_heads=8, num_key_value_heads=4, head_dim=8, intermediate_size=96),
}


def export(drafter, cfg, out, **kw):
    """A float32 export: these tests compare the written tensors exactly with the float32 drafter."""
    kw.setdefault("dtype", torch.float32)
    return export_drafter(drafter, cfg, out, **kw)


def make(variant="plain", seed=0, **target_kw):
    target = Target(tiny_qwen3(**target_kw))
    drafter, cfg = tiny_drafter(target, seed=seed, **VARIANTS[variant])
    return target, drafter.eval(), cfg


def random_inputs(cfg: DrafterConfig, batch=2, ctx=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    h, n, blocks = cfg.hidden_size, len(cfg.target_layer_ids), 2
    q = blocks * cfg.block_size
    block_embeds = torch.randn(batch, q, h, generator=g)
    features = torch.randn(batch, ctx, n * h, generator=g)
    anchors = torch.tensor([[2, 5], [1, 6]])
    offsets = torch.arange(cfg.block_size)
    block_positions = (anchors[:, :, None] + offsets).reshape(batch, q)
    context_positions = torch.arange(ctx).expand(batch, ctx)
    return block_embeds, features, block_positions, context_positions, anchors


def dense_masks(cfg, anchors, ctx, batch=2):
    keep = torch.ones_like(anchors, dtype=torch.bool)
    return build_masks("sdpa", cfg.layer_types, anchors, keep, ctx, cfg.block_size, cfg.sliding_window)


def hf_load(out):
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True, dtype=torch.float32)
    return model.eval(), info


# -- AutoModel round trip ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_automodel_round_trip_matches_drafter(tmp_path, variant):
    _, drafter, cfg = make(variant)
    out = export(drafter, cfg, tmp_path / f"export_{variant}")
    model, info = hf_load(out)
    assert type(model).__name__ == "DFlashDraftModel"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert set(model.state_dict()) == set(serving_tensor_names(cfg))
    embeds, feats, bpos, cpos, anchors = random_inputs(cfg)
    masks = dense_masks(cfg, anchors, feats.shape[1])
    with torch.no_grad():
        assert any(not m.all() for m in masks.values())  # the masked path really masks something
        for m in (None, masks):
            want = drafter(embeds, feats, bpos, cpos, m)
            got = model(embeds, feats, bpos, cpos, m)
            assert got.shape == want.shape == embeds.shape
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        # positional and keyword calls give the same answer (same signature as DFlashDrafter.forward)
        got_kw = model(block_embeds=embeds, target_features=feats, block_positions=bpos, context_positions=cpos)
        torch.testing.assert_close(got_kw, drafter(embeds, feats, bpos, cpos), rtol=0, atol=1e-6)
    assert model.config.dflash_config["target_layer_ids"] == cfg.target_layer_ids
    assert model.mask_token_id == cfg.mask_token_id and model.block_size == cfg.block_size


def test_modeling_file_is_drafter_source_verbatim(tmp_path):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    text = (out / MODELING_FILE).read_text()
    source = DRAFTER_SOURCE.read_text()
    assert text.startswith(source.rstrip("\n") + "\n")
    assert "class DFlashDraftModel(PreTrainedModel)" in text[len(source) - 1 :]
    assert "dflash_train" not in source.split('"""', 2)[2].split("class ")[0]  # no package imports


# -- config.json and tensors -------------------------------------------------------------------


def test_config_json_has_every_spec_field(tmp_path):
    _, drafter, cfg = make("plain")
    out = export(drafter, cfg, tmp_path / "e")
    config = json.loads((out / "config.json").read_text())
    expected = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 512,
        "vocab_size": 128,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "layer_types": ["full_attention", "full_attention"],
        "sliding_window": None,
        "use_sliding_window": False,
        "block_size": 4,
        "num_target_layers": 6,
        "dflash_config": {"mask_token_id": 127, "target_layer_ids": [1, 3]},
        "eagle_aux_hidden_state_layer_ids": [2, 4],
        "dtype": "float32",
        "torch_dtype": "float32",
    }
    for key, value in expected.items():
        assert key in config, f"config.json lacks {key}"
        assert config[key] == value, (key, config[key], value)
    assert "rope_scaling" not in config or config["rope_scaling"] is None
    module, cls = config["auto_map"]["AutoModel"].split(".")
    assert cls == "DFlashDraftModel" and (out / f"{module}.py").is_file()
    assert cfg.target_layer_ids == [1, 3] and cfg.mask_token_id == 127  # the values above are the config's


def test_config_json_sliding_bias_and_rope_scaling(tmp_path):
    _, drafter, cfg = make("sliding_bias_scaled")
    out = export(drafter, cfg, tmp_path / "e", dtype=torch.bfloat16)
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == ["full_attention", "sliding_attention", "full_attention"]
    assert config["sliding_window"] == 3 and config["use_sliding_window"] is True
    assert config["attention_bias"] is True
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert config["rope_parameters"] == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert config["dflash_config"]["target_layer_ids"] == cfg.target_layer_ids and len(cfg.target_layer_ids) == 3
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118


def _vllm_aux_layers(config: dict) -> list[int]:
    """How vLLM picks the target layers to capture (a reimplementation of
    ``get_eagle3_aux_layers_from_config``): ``eagle_aux_hidden_state_layer_ids`` if set,
    else ``dflash_config.target_layer_ids`` + 1 (its capture point j = input of layer j)."""
    return list(config.get("eagle_aux_hidden_state_layer_ids") or
                [i + 1 for i in config["dflash_config"]["target_layer_ids"]])


def _sglang_fields(config: dict) -> dict:
    """What SGLang's ``parse_dflash_draft_config`` reads: dflash_config first, then the top level."""
    dflash = config["dflash_config"]
    return {k: dflash.get(k, config.get(k)) for k in ("target_layer_ids", "block_size", "mask_token_id",
                                                       "num_target_layers")} | {
        "num_hidden_layers": config["num_hidden_layers"], "architectures": config["architectures"]}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_keys_both_engines_read(tmp_path, variant):
    """vLLM sizes fc and captures layers from eagle_aux_hidden_state_layer_ids (else target_layer_ids + 1);
    SGLang reads dflash_config / top-level block_size; both must name the layers we trained on."""
    _, drafter, cfg = make(variant)
    config = json.loads((export(drafter, cfg, tmp_path / "e") / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in cfg.target_layer_ids]
    assert _vllm_aux_layers(config) == [i + 1 for i in cfg.target_layer_ids]
    assert len(_vllm_aux_layers(config)) * config["hidden_size"] == drafter.fc.weight.shape[1]  # vLLM's fc input
    assert _sglang_fields(config) == {
        "target_layer_ids": cfg.target_layer_ids, "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
        "num_target_layers": cfg.num_target_layers, "num_hidden_layers": cfg.num_hidden_layers,
        "architectures": ["DFlashDraftModel"]}
    assert "target_layer_ids" not in config  # a top-level copy would be read with yet another +1 by vLLM
    readme = (tmp_path / "e" / "README.md").read_text()
    assert f'"num_speculative_tokens": {cfg.block_size - 1}' in readme
    assert "--speculative-algorithm DFLASH" in readme and f"--speculative-num-draft-tokens {cfg.block_size}" in readme


def test_inconsistent_aux_layer_ids_refused(tmp_path):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    config = json.loads((out / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [1, 3]  # = target_layer_ids: off by one for vLLM
    (out / "config.json").write_text(json.dumps(config))
    (out / "checksums.json").unlink()  # edited on purpose: the export's checksums no longer apply
    with pytest.raises(ValueError, match=r"eagle_aux_hidden_state_layer_ids \[1, 3\] must be .* \[2, 4\]"):
        load_drafter_folder(out)
    del config["eagle_aux_hidden_state_layer_ids"]  # a folder without it (the authors') still loads
    (out / "config.json").write_text(json.dumps(config))
    load_drafter_folder(out)


def test_default_export_is_bfloat16_and_eval_upcasts(tmp_path):
    """export_drafter without dtype writes bf16; eval's loader reads it into a float32 target's dtype,
    and speculative decoding with it is still lossless."""
    from dflash_train.decoding.speculative import speculative_generate, target_generate
    from dflash_train.eval.loader import load_drafter_folder as eval_load

    target, drafter, cfg = make()
    out = export_drafter(drafter, cfg, tmp_path / "e")
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = eval_load(out, target)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert torch.equal(loaded.fc.weight, drafter.fc.weight.to(torch.bfloat16).float())
    prompt = torch.tensor([[5, 9, 2, 44]])
    assert speculative_generate(target, loaded, prompt, 10).tokens == target_generate(target, prompt, 10).tokens


def expected_names_by_hand(layers, h, q_out, kv_out, hd, inter, n, bias):
    """The spec-4 list written out independently of both the model and serving_tensor_names."""
    names = {"norm.weight": (h,), "fc.weight": (h, n * h), "hidden_norm.weight": (h,)}
    for i in range(layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        names.update({a + "q_proj.weight": (q_out, h), a + "k_proj.weight": (kv_out, h),
                      a + "v_proj.weight": (kv_out, h), a + "o_proj.weight": (h, q_out),
                      a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,),
                      m + "gate_proj.weight": (inter, h), m + "up_proj.weight": (inter, h),
                      m + "down_proj.weight": (h, inter),
                      f"layers.{i}.input_layernorm.weight": (h,), f"layers.{i}.post_attention_layernorm.weight": (h,)})
        if bias:
            names.update({a + "q_proj.bias": (q_out,), a + "k_proj.bias": (kv_out,), a + "v_proj.bias": (kv_out,),
                          a + "o_proj.bias": (h,)})
    return names


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_safetensors_has_exactly_the_spec_tensors(tmp_path, variant):
    _, drafter, cfg = make(variant)
    out = export(drafter, cfg, tmp_path / "e")
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        written = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        state = drafter.state_dict()
        for k in written:
            assert torch.equal(f.get_tensor(k), state[k]), k
    expected = serving_tensor_names(cfg)
    assert written == expected
    by_hand = expected_names_by_hand(
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim, cfg.head_dim, cfg.intermediate_size, len(cfg.target_layer_ids),
        cfg.attention_bias,
    )
    assert expected == by_hand
    assert not [k for k in written if "embed" in k or "lm_head" in k or "rotary" in k or "inv_freq" in k]
    assert written["fc.weight"] == (cfg.hidden_size, len(cfg.target_layer_ids) * cfg.hidden_size)


def test_export_refuses_a_state_dict_that_is_not_the_spec(tmp_path):
    _, drafter, cfg = make()
    drafter.extra = torch.nn.Linear(2, 2)  # would be exported under an unexpected name
    with pytest.raises(ValueError, match="unexpected tensors: extra.bias, extra.weight"):
        export(drafter, cfg, tmp_path / "e")
    assert not (tmp_path / "e").exists()
    _, drafter, cfg = make()
    with pytest.raises(ValueError, match=r"missing tensors: layers\.2\."):
        export(drafter, dataclasses.replace(cfg, num_hidden_layers=3, layer_types=["full_attention"] * 3),
                       tmp_path / "e")
    with pytest.raises(ValueError, match="not resolved"):
        export(drafter, dataclasses.replace(cfg, mask_token_id=None), tmp_path / "e")


# -- existing folders ----------------------------------------------------------------------------


def test_existing_folder_refused_unless_force(tmp_path):
    _, drafter, cfg = make(seed=0)
    out = tmp_path / "e"
    out.mkdir()
    export(drafter, cfg, out)  # an empty folder is fine
    (out / "stale.txt").write_text("old")
    with pytest.raises(FileExistsError, match="--force"):
        export(drafter, cfg, out)
    assert (out / "stale.txt").exists()
    _, drafter2, cfg2 = make(seed=5)
    export(drafter2, cfg2, out, force=True)
    assert not (out / "stale.txt").exists()  # replaced as a whole, not merged
    loaded, _ = load_drafter_folder(out)
    assert torch.equal(loaded.fc.weight, drafter2.fc.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]  # no temp folders left behind
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        export(drafter, cfg, tmp_path / "file", force=True)


def test_failed_export_leaves_nothing(tmp_path):
    _, drafter, cfg = make()

    class BrokenTokenizer:
        def save_pretrained(self, path):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        export(drafter, cfg, tmp_path / "e", tokenizer=BrokenTokenizer())
    assert list(tmp_path.iterdir()) == []


def test_tokenizer_files_are_copied(tmp_path):
    if not (SMOLLM2 / "tokenizer.json").exists():
        pytest.skip("SmolLM2 assets not prepared (make assets)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e", tokenizer=tok, extra_config={"eos_token_id": 2})
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert AutoTokenizer.from_pretrained(out)("hello world")["input_ids"] == tok("hello world")["input_ids"]
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 2
    with pytest.raises(ValueError, match="conflicts"):
        export(drafter, cfg, tmp_path / "f", extra_config={"block_size": 99})


# -- load_drafter_folder ---------------------------------------------------------------------------


def _normalized(cfg: DrafterConfig) -> DrafterConfig:
    scaling = cfg.rope_scaling
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    elif scaling:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    return dataclasses.replace(cfg, rope_scaling=scaling)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_load_folder_round_trip(tmp_path, variant):
    target, drafter, cfg = make(variant)
    out = export(drafter, cfg, tmp_path / "e")
    loaded, cfg2 = load_drafter_folder(out, target)
    assert cfg2 == _normalized(cfg)
    assert loaded.state_dict().keys() == drafter.state_dict().keys()
    for k, v in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    embeds, feats, bpos, cpos, _ = random_inputs(cfg)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(embeds, feats, bpos, cpos), drafter(embeds, feats, bpos, cpos))
    loaded2, _ = load_drafter_folder(out, target.facts)  # TargetFacts works too
    assert torch.equal(loaded2.fc.weight, drafter.fc.weight)
    loaded3, _ = load_drafter_folder(out, target.model.config)  # ... and a HF config
    assert torch.equal(loaded3.norm.weight, drafter.norm.weight)


@pytest.mark.parametrize(
    "target_kw, message",
    [
        (dict(hidden=32), r"hidden_size 64 != the target's hidden size 32"),
        (dict(num_layers=4), r"num_target_layers 6 != the target's 4 layers"),
        (dict(vocab=256), r"vocab_size 128 != the target's vocab size 256"),
    ],
)
def test_load_folder_rejects_mismatched_target(tmp_path, target_kw, message):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    other = Target(tiny_qwen3(**target_kw))
    with pytest.raises(ValueError, match=message):
        load_drafter_folder(out, other)


def test_load_folder_rejects_layer_ids_out_of_range(tmp_path):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    config = json.loads((out / "config.json").read_text())
    del config["num_target_layers"]  # a folder that does not record it: the ids are still checked
    (out / "config.json").write_text(json.dumps(config))
    (out / "checksums.json").unlink()  # edited on purpose: the export's checksums no longer apply
    with pytest.raises(ValueError, match=r"target_layer_ids \[3\] out of range for a target with 3 layers"):
        load_drafter_folder(out, Target(tiny_qwen3(num_layers=3)))
    _, cfg2 = load_drafter_folder(out, Target(tiny_qwen3(num_layers=6)))
    assert cfg2.num_target_layers == 6  # filled from the target


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_load_folder_missing_file(tmp_path, name):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    (out / name).unlink()
    with pytest.raises(FileNotFoundError, match=name):
        load_drafter_folder(out)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_drafter_folder(tmp_path / "nowhere")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_load_folder_corrupt_safetensors(tmp_path, damage):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    path = out / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00not a safetensors file" * 10,
                      "empty": b""}[damage])
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file") as info:
        load_drafter_folder(out)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_load_folder_bad_config_json(tmp_path):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    (out / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        load_drafter_folder(out)
    (out / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64}))
    with pytest.raises(ValueError, match="no 'dflash_config'"):
        load_drafter_folder(out)


def _rewrite_tensors(path: Path, edit):
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.pop("layers.1.mlp.up_proj.weight"), r"missing tensors: layers\.1\.mlp\.up_proj\.weight"),
        (lambda t: t.update({"lm_head.weight": torch.zeros(128, 64)}), r"unexpected tensors: lm_head\.weight"),
        (lambda t: t.update({"model.norm.weight": t.pop("norm.weight")}),
         r"missing tensors: norm\.weight; unexpected tensors: model\.norm\.weight"),
        (lambda t: t.update({"fc.weight": torch.zeros(64, 64)}), r"wrong shapes: fc\.weight \(64, 64\) \(expected \(64, 128\)\)"),
    ],
)
def test_load_folder_strict_names_and_shapes(tmp_path, edit, message):
    _, drafter, cfg = make()
    out = export(drafter, cfg, tmp_path / "e")
    _rewrite_tensors(out / "model.safetensors", edit)
    with pytest.raises(ValueError, match=message):
        load_drafter_folder(out)


def test_load_published_style_folder(tmp_path):
    """The authors' config.json style (z-lab/Qwen3-8B-DFlash-b16), scaled down; extra keys tolerated."""
    target, drafter, cfg = make()
    folder = tmp_path / "published"
    folder.mkdir()
    config = {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 4, "bos_token_id": 1,
        "dflash_config": {"mask_token_id": 127, "target_layer_ids": [1, 3]}, "dtype": "bfloat16",
        "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 128, "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": 512, "max_window_layers": 2, "model_type": "qwen3", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "num_target_layers": 6, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 10000, "sliding_window": None, "tie_word_embeddings": False,
        "transformers_version": "4.57.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 128,
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items()},
              str(folder / "model.safetensors"))
    loaded, cfg2 = load_drafter_folder(folder, target)
    assert cfg2 == _normalized(cfg)
    assert loaded.fc.weight.dtype == torch.float32
    assert torch.equal(loaded.fc.weight, drafter.fc.weight.to(torch.bfloat16).float())
