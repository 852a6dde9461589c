"""train.drafter_init=target: drafter layer i starts as target layer L - N + i (and the final norm)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_chat_target, tiny_qwen3

from dflash_train.config import config_from_dict, load_config
from dflash_train.models.config import DrafterConfig, resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.models.target import Target
from dflash_train.models.target_init import init_from_target
from dflash_train.train import trainer as trainer_mod
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
COPIED = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
          "input_layernorm.weight", "post_attention_layernorm.weight"]


def build(target: Target, layers: int, **fields) -> DFlashDrafter:
    cfg = resolve_drafter_config(DrafterConfig(num_hidden_layers=layers, **fields), target.facts, 0)
    torch.manual_seed(0)
    return DFlashDrafter(cfg)


def hf_layer(target: Target, j: int) -> dict[str, torch.Tensor]:
    """Target layer j's parameters read from the HF model itself (not through Target.layers)."""
    return {k[len(f"model.layers.{j}."):]: v for k, v in target.model.state_dict().items()
            if k.startswith(f"model.layers.{j}.")}


def test_real_smollm2_layers_are_copied(smollm2_path):
    target = Target.load(smollm2_path)
    drafter = build(target, 3)
    fc, hidden_norm = drafter.fc.weight.clone(), drafter.hidden_norm.weight.clone()
    assert init_from_target(drafter, target) == [27, 28, 29]  # SmolLM2-135M: 30 layers
    for i, j in enumerate([27, 28, 29]):
        theirs, mine = hf_layer(target, j), drafter.layers[i].state_dict()
        for name in COPIED:
            assert torch.equal(mine[name], theirs[name]), (i, name)
        assert "self_attn.q_norm.weight" not in theirs  # Llama: none; ours stay at their init
        assert torch.equal(mine["self_attn.q_norm.weight"], torch.ones(64))
        assert torch.equal(mine["self_attn.k_norm.weight"], torch.ones(64))
    assert torch.equal(drafter.norm.weight, target.model.state_dict()["model.norm.weight"])
    assert torch.equal(drafter.fc.weight, fc) and torch.equal(drafter.hidden_norm.weight, hidden_norm)


def test_qk_norms_are_copied_when_the_target_has_them():
    target = Target(tiny_qwen3(num_layers=6))
    drafter = build(target, 2)
    assert init_from_target(drafter, target) == [4, 5]
    for i, j in enumerate([4, 5]):
        theirs, mine = hf_layer(target, j), drafter.layers[i].state_dict()
        for name in [*COPIED, "self_attn.q_norm.weight", "self_attn.k_norm.weight"]:
            assert torch.equal(mine[name], theirs[name]), (i, name)


@pytest.mark.parametrize(("fields", "message"), [
    ({"intermediate_size": 96}, r"layer 0 <- target layer 4: mlp.gate_proj.weight is \[96, 64\].*drafter.intermediate_size"),
    ({"num_attention_heads": 8}, r"self_attn.q_proj.weight is \[128, 64\] in the drafter but \[64, 64\].*drafter.num_attention_heads/head_dim"),
    ({"attention_bias": True}, r"only the drafter has self_attn.q_proj.bias; set drafter.attention_bias"),
])
def test_shape_mismatch_is_one_line_naming_the_field(fields, message):
    target = Target(tiny_qwen3(num_layers=6))
    drafter = build(target, 2, **fields)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    with pytest.raises(ValueError, match=message) as err:
        init_from_target(drafter, target)
    assert "\n" not in str(err.value) and str(err.value).startswith("train.drafter_init=target: ")
    assert all(torch.equal(v, before[k]) for k, v in drafter.state_dict().items())  # nothing half-copied


def test_more_drafter_layers_than_target_layers():
    target = Target(tiny_qwen3(num_layers=3))
    with pytest.raises(ValueError, match=r"drafter.num_hidden_layers \(4\) exceeds the target's 3 layers"):
        init_from_target(build(target, 4, target_layer_ids=[0, 1]), target)


def test_config_values_and_conflicts(tmp_path):
    cfg = load_config("smollm2-1gpu", ["data.trim_loops=true", "train.drafter_init=target"])  # the CLI's path
    assert cfg.train.drafter_init == "target" and cfg.data.trim_loops is True
    assert load_config("smollm2-1gpu").train.drafter_init == "random"
    job = tiny_chat_job(tmp_path)
    for bad, message in [({"drafter_init": "targets"}, "train.drafter_init must be 'random' or 'target'"),
                         ({"drafter_init": "target", "init_from": "x"}, "choose one")]:
        with pytest.raises(ValueError, match=message):
            config_from_dict({**job, "train": {**job["train"], **bad}}).validate()


def test_training_starts_from_the_target_and_resume_keeps_the_checkpoint(tmp_path, monkeypatch):
    """Through the training job: step 0 holds the target's last layer; a resumed run starts
    from the saved weights, not from a second copy of the target's."""
    states = []
    original = trainer_mod.Trainer.run

    def recording(self, on_step_end=None):
        states.append({k: v.clone() for k, v in self.drafter.state_dict().items()})
        out = original(self, on_step_end)
        states.append({k: v.clone() for k, v in self.drafter.state_dict().items()})
        return out

    monkeypatch.setattr(trainer_mod.Trainer, "run", recording)
    target = tiny_chat_target(SMOLLM2)
    last = hf_layer(target, 5)  # the tiny target has 6 layers, the job's drafter 1
    job = tiny_chat_job(tmp_path, max_steps=3, drafter_init="target")
    messages = []
    train(config_from_dict(job), target=target, echo=messages.append)
    assert any("drafter layers start as target layers [5]" in str(m) for m in messages)
    job["train"].update(max_steps=5, resume="auto")
    train(config_from_dict(job), target=target, echo=lambda *a: None)
    start, end, resumed_start, _ = states
    for name in [*COPIED, "self_attn.q_norm.weight"]:
        assert torch.equal(start[f"layers.0.{name}"], last[name]), name
    moved = [n for n in COPIED if not torch.equal(end[f"layers.0.{n}"], last[n])]
    assert moved, "training did not change the copied weights: the resume check below would prove nothing"
    for key, value in end.items():
        assert torch.equal(resumed_start[key], value), key
