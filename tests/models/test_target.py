"""Target wrapper: features equal HF hidden states; pairing validation; mask token."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_qwen3

from dflash_train.models.config import DrafterConfig, default_target_layer_ids, resolve_drafter_config
from dflash_train.models.target import Target, choose_mask_token_id


def test_features_equal_output_hidden_states_and_stop_early():
    model = tiny_qwen3(num_layers=6)
    target = Target(model)
    ids = torch.randint(0, 128, (2, 10))
    attn = torch.ones_like(ids)
    attn[1, 7:] = 0
    ref = model(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states
    calls = []
    hooks = [layer.register_forward_hook(lambda *a, i=i: calls.append(i)) for i, layer in enumerate(target.layers)]
    feats = target.features(ids, attn, [1, 3])
    for h in hooks:
        h.remove()
    torch.testing.assert_close(feats, torch.cat([ref[2], ref[4]], dim=-1))
    assert calls == [0, 1, 2, 3], "layers after the deepest needed one must not run"
    assert len(target.layers) == 6  # the full model is restored


def test_tied_and_untied_heads():
    tied = Target(tiny_qwen3(tie=True))
    assert tied.lm_head_weight.data_ptr() == tied.embed_tokens.weight.data_ptr()
    untied = Target(tiny_qwen3(tie=False))
    assert untied.lm_head_weight.data_ptr() != untied.embed_tokens.weight.data_ptr()
    assert not any(p.requires_grad for p in untied.parameters())


def test_default_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(30, 1) == [15]
    ids = default_target_layer_ids(28, 3)
    assert ids[0] == 1 and ids[-1] == 25


def test_pairing_validation_errors():
    facts = Target(tiny_qwen3(num_layers=6)).facts
    with pytest.raises(ValueError, match="hidden size"):
        resolve_drafter_config(DrafterConfig(hidden_size=32), facts, 5)
    with pytest.raises(ValueError, match="out of range"):
        resolve_drafter_config(DrafterConfig(target_layer_ids=[1, 6]), facts, 5)
    with pytest.raises(ValueError, match="no row"):
        resolve_drafter_config(DrafterConfig(num_hidden_layers=2, mask_token_id=128), facts, None)
    with pytest.raises(ValueError, match="multiple"):
        resolve_drafter_config(DrafterConfig(num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=2), facts, 5)
    with pytest.raises(ValueError, match="repeated"):
        resolve_drafter_config(DrafterConfig(num_hidden_layers=5), facts, 5)
    cfg = resolve_drafter_config(DrafterConfig(num_hidden_layers=2), facts, 7)
    assert cfg.target_layer_ids == default_target_layer_ids(6, 2) and cfg.mask_token_id == 7


def test_mask_token_choice(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    idx, reason = choose_mask_token_id(tok, 49152)
    assert idx not in (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id)
    assert tok.convert_ids_to_tokens(idx) not in tok.chat_template and idx in tok.added_tokens_decoder
    # a padded embedding table (Qwen3 style) -> the first unused row
    assert choose_mask_token_id(tok, 49160)[0] == 49152
