"""DFlash2 serving folder: config keys, the authors' tensor names, export -> load round trips."""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.export.serving import export_drafter, load_drafter_folder, serving_tensor_names
from dflash_train.models.kinds.dflash2 import selector_walk
from dflash_train.models.target import Target

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DFLASH2 = dict(kind="dflash2", options=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=5))


def _trained_like(target):
    """A DFlash2 drafter whose convolutions and selector are far from identity (as after training)."""
    drafter, cfg = tiny_drafter(target, num_layers=2, block_size=4, target_layer_ids=[0, 2], **DFLASH2)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "conv" in name or "candidate_selector" in name:
                p.normal_(std=0.3)
    return drafter.eval(), cfg


def _inputs(cfg, ctx=6, seed=2):
    g = torch.Generator().manual_seed(seed)
    q = 2 * cfg.block_size
    return (torch.randn(1, q, cfg.hidden_size, generator=g), torch.randn(1, ctx, 2 * cfg.hidden_size, generator=g),
            torch.arange(ctx, ctx + q)[None], torch.arange(ctx)[None])


def test_config_and_tensor_names(tmp_path):
    target = Target(tiny_qwen3(num_layers=4))
    drafter, cfg = _trained_like(target)
    out = export_drafter(drafter, cfg, tmp_path / "e", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert config["auto_map"] == {"AutoModel": "modeling_dflash.DFlash2DraftModel"}
    assert config["dflash_config"] == {"mask_token_id": cfg.mask_token_id, "target_layer_ids": [0, 2],
                                       "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8,
                                       "selector_top_k": 5}
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())  # noqa: SIM118
    assert names == set(serving_tensor_names(cfg))
    assert "candidate_selector.predecessor_codebook" in names and "candidate_selector.successor_codebook" in names
    assert "layers.1.mlp_conv.base_kernel" in names and "layers.0.attention_conv.kernel_projection.weight" in names
    assert not any(n.endswith("codebook.weight") for n in names)


def test_round_trip_ours_and_automodel(tmp_path):
    from transformers import AutoModel

    target = Target(tiny_qwen3(num_layers=4))
    drafter, cfg = _trained_like(target)
    out = export_drafter(drafter, cfg, tmp_path / "e", dtype=torch.float32)
    loaded, cfg2 = load_drafter_folder(out, target)
    assert cfg2.kind == "dflash2" and cfg2.options["selector_top_k"] == 5 and cfg2.options["conv_group_size"] == 16
    args = _inputs(cfg)
    with torch.no_grad():
        want = drafter(*args)
        torch.testing.assert_close(loaded(*args), want, rtol=0, atol=0)
        model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True,
                                                dtype=torch.float32)
        assert type(model).__name__ == "DFlash2DraftModel"
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        torch.testing.assert_close(model.eval()(*args), want, rtol=0, atol=1e-6)
        hidden = want[:, 1:4]
        logits = hidden @ target.lm_head_weight.t()
        ours = selector_walk(drafter.candidate_selector, hidden, logits, torch.tensor([5]))[0]
        theirs = selector_walk(model.candidate_selector, hidden, logits, torch.tensor([5]))[0]
        assert torch.equal(ours, theirs)


def test_spec_generate_dflash2_equals_plain_greedy(tmp_path):
    """The exported model's own decoder drafts with the selector walk and stays lossless."""
    from transformers import AutoModel

    hf_target = tiny_qwen3(num_layers=4)
    drafter, cfg = _trained_like(Target(hf_target))
    out = export_drafter(drafter, cfg, tmp_path / "e", dtype=torch.float32)
    model = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
    prompt = torch.tensor([[3, 17, 9, 41, 5, 77]])
    got = model.spec_generate(hf_target, prompt, max_new_tokens=12, stop_token_ids=None, temperature=0.0)
    want = hf_target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, want[:, : got.shape[1]]) and got.shape[1] == prompt.shape[1] + 12
