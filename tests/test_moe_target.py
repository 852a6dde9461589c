"""A mixture-of-experts target (tiny Qwen3-MoE, random weights) through the real pipeline:
its features, training (the loss falls), exact resume, export, and speculative eval with
the lossless check, on both decoding engines."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_drafter, train_stopping_at

from dflash_train.cli import main
from dflash_train.config import config_from_dict
from dflash_train.models.target import Target
from dflash_train.models.tiny import tiny_qwen3_moe
from dflash_train.run_folder import latest_checkpoint
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[1] / "assets" / "smollm2"
LAYERS = [1, 3]

for _name in list(logging.root.manager.loggerDict):  # torch.distributed.checkpoint's per-tensor DEBUG lines
    if _name.startswith("c10d-"):
        logging.getLogger(_name).setLevel(logging.INFO)


def moe_chat_target(output_router_logits: bool = False) -> Target:
    """``testkit.tiny_chat_target`` with a sparse MLP in every layer (4 experts, top-2)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    model = tiny_qwen3_moe(num_layers=6, hidden=64, vocab=len(tokenizer), tie=True)
    model.config.output_router_logits = output_router_logits
    with torch.no_grad():  # sharper logits than HF's init, as in tiny_chat_target
        model.get_input_embeddings().weight.normal_(0.0, 0.5)
    return Target(model, tokenizer)


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_tiny_moe_routes_tokens_to_different_experts():
    """Every layer is sparse and each expert gets work: the test below exercises real routing."""
    model = tiny_qwen3_moe()
    assert all(type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in model.model.layers)
    ids = torch.randint(0, 127, (2, 32), generator=torch.Generator().manual_seed(0))
    out = model(ids, output_router_logits=True)
    for logits in out.router_logits:
        chosen = logits.topk(2, dim=-1).indices
        assert torch.bincount(chosen.flatten(), minlength=4).min() > 0


def test_bench_flop_model_counts_the_active_experts():
    """``bench/flops.py`` counts, per token and layer, the weights a token is multiplied by: in a
    MoE layer its top-k experts and the router, never the other experts. Counted here from the
    model's own parameters."""
    from dflash_train.bench.flops import Shape

    model = tiny_qwen3_moe(num_experts=8, experts_per_token=2)
    cfg, layer = model.config, model.model.layers[0]
    attention = sum(p.numel() for n, p in layer.self_attn.named_parameters() if n.endswith("proj.weight"))
    experts = layer.mlp.experts
    active_experts = cfg.num_experts_per_tok * (experts.gate_up_proj[0].numel() + experts.down_proj[0].numel())
    router = layer.mlp.gate.weight.numel()
    assert router == cfg.hidden_size * cfg.num_experts
    assert Shape.of(Target(model).facts).params_per_layer == attention + active_experts + router


@pytest.mark.parametrize("family, expected", [
    ("mixtral", (2 * 14336, 8)),  # intermediate_size is the expert's width; top-2 of 8
    ("qwen2_moe", (4 * 1408 + 5632, 60)),  # top-4 experts of 1408 and a shared expert of 5632
    ("qwen3_moe", (8 * 768, 128)),  # Qwen3-30B-A3B
    ("qwen3", (None, 0)),  # dense: the FLOP model uses intermediate_size
])
def test_moe_widths_of_each_family(family, expected):
    """The per-token MLP width and router width read from each MoE family's config names (the
    defaults of transformers' config classes are those families' released models)."""
    from transformers import AutoConfig

    from dflash_train.models.target import target_facts

    if family == "qwen3_moe":
        cfg = AutoConfig.for_model(family, hidden_size=2048, num_experts=128, num_experts_per_tok=8,
                                   moe_intermediate_size=768, intermediate_size=6144)
    else:
        cfg = AutoConfig.for_model(family)
    facts = target_facts(cfg)
    assert (facts.active_mlp_width, facts.router_experts) == expected


def test_moe_features_are_the_layer_outputs():
    """Features (truncated run, packed rows, final hidden) equal a full forward's hidden states."""
    target = Target(tiny_qwen3_moe())
    ids = torch.randint(0, 127, (2, 20), generator=torch.Generator().manual_seed(1))
    hidden = target.model(ids, output_hidden_states=True).hidden_states
    want = torch.cat([hidden[i + 1] for i in LAYERS], dim=-1)
    torch.testing.assert_close(target.features(ids, None, LAYERS), want, rtol=0, atol=0)
    features, final = target.features(ids, None, LAYERS, final_hidden=True)
    torch.testing.assert_close(features, want, rtol=0, atol=0)
    torch.testing.assert_close(final, hidden[-1], rtol=0, atol=0)
    doc_ids = torch.tensor([[0] * 8 + [1] * 12] * 2)  # two conversations packed in each row
    packed = target.features(ids, None, LAYERS, doc_ids=doc_ids)
    alone = target.features(ids[:, 8:], None, LAYERS)
    torch.testing.assert_close(packed[:, 8:], alone, rtol=1e-5, atol=1e-5)
    assert len(target.layers) == 6  # the truncation put the full layer list back


def test_drafter_init_from_an_moe_target_is_one_clear_error():
    """``train.drafter_init=target`` copies a dense SwiGLU; an MoE layer has none: say so at start-up."""
    from dflash_train.models.target_init import init_from_target

    target = Target(tiny_qwen3_moe())
    drafter, _ = tiny_drafter(target)
    with pytest.raises(ValueError, match=r"only the drafter has mlp\.gate_proj\.weight.*drafter_init=random"):
        init_from_target(drafter, target)


def test_moe_target_with_router_logits_on_decodes_losslessly():
    """A checkpoint saved with ``output_router_logits: true`` (common after MoE fine-tuning) makes
    HF's forward add the router aux loss, which reads the attention mask as [batch, seq] and
    fails on the static engine's 4D mask. A frozen target never needs it: ``Target`` turns it off."""
    from dflash_train.eval.evaluate import evaluate

    model = tiny_qwen3_moe()
    model.config.output_router_logits = True
    target = Target(model)
    assert model.config.output_router_logits is False
    drafter, _ = tiny_drafter(target, block_size=4)
    for engine in ("hf", "static"):
        report = evaluate(target, drafter, [[1, 2, 3, 4, 5]], max_new_tokens=10, stop_token_ids=[], engine=engine)
        assert report["lossless"]["ok"], engine


def test_capture_safe_experts_only_for_graphed_non_bf16_grouped_mm():
    from dflash_train.decoding.experts import needs_capture_safe_experts

    model = tiny_qwen3_moe()
    assert model.config._experts_implementation == "grouped_mm"
    assert needs_capture_safe_experts(model, torch.float32, use_graph=True)
    assert not needs_capture_safe_experts(model, torch.bfloat16, use_graph=True)  # its kernel never syncs
    assert not needs_capture_safe_experts(model, torch.float32, use_graph=False)  # nothing is captured
    model.config._experts_implementation = "eager"
    assert not needs_capture_safe_experts(model, torch.float32, use_graph=True)


def test_static_steps_use_capture_safe_experts_and_decode_losslessly(monkeypatch):
    """On CUDA in float32 the captured steps switch the experts to ``batched_mm`` (grouped_mm
    syncs the host there, which capture refuses); forced here on CPU: the steps run
    batched_mm, the prompt runs the model's own kernel, tokens equal plain greedy, and the
    model's setting is back afterwards."""
    from dflash_train.decoding import static
    from dflash_train.decoding.speculative import speculative_generate, target_generate

    monkeypatch.setattr(static, "needs_capture_safe_experts", lambda *_: True)
    model = tiny_qwen3_moe(vocab=128)
    target = Target(model)
    drafter, _ = tiny_drafter(target, block_size=4, seed=3)
    drafter.eval()
    seen = []  # (experts kernel, tokens) of every experts call
    for layer in model.model.layers:
        layer.mlp.experts.register_forward_pre_hook(
            lambda module, args: seen.append((module.config._experts_implementation, args[0].shape[0])))
    decoder = static.StaticDecoder(target, drafter, max_len=64, mode="eager")
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])
    out = decoder.speculative(ids, 20)
    in_decoder = list(seen)
    assert out.tokens == target_generate(target, ids, 20).tokens
    assert out.acceptance_lengths == speculative_generate(target, drafter, ids, 20).acceptance_lengths
    assert {kernel for kernel, tokens in in_decoder if tokens == ids.shape[1]} == {"grouped_mm"}  # the prompt
    assert {kernel for kernel, tokens in in_decoder if tokens <= 4} == {"batched_mm"}  # the verify steps
    assert model.config._experts_implementation == "grouped_mm"


def _drafter_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(latest_checkpoint(run_dir) / "drafter.safetensors"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 12-step run on the MoE target, and the same run stopped at step 6 and resumed."""
    root = tmp_path_factory.mktemp("moe")
    steps = 12
    train(config_from_dict(tiny_chat_job(root / "full", max_steps=steps)), target=moe_chat_target(),
          echo=lambda *a: None)
    split = tiny_chat_job(root / "split", max_steps=steps)
    train_stopping_at(config_from_dict(split), 6, moe_chat_target())
    assert latest_checkpoint(root / "split" / "run").name.endswith("06")
    resumed = config_from_dict({**split, "train": {**split["train"], "resume": "auto"}})
    train(resumed, target=moe_chat_target(), echo=lambda *a: None)
    return root, steps


@pytest.mark.slow  # three short training runs
def test_moe_training_learns_and_resumes_exactly(trained):
    root, steps = trained
    full, split = losses(root / "full" / "run"), losses(root / "split" / "run")
    assert len(full) == steps and sum(full[-3:]) / 3 < 0.8 * sum(full[:3]) / 3, full
    assert len(split) == steps
    torch.testing.assert_close(torch.tensor(split), torch.tensor(full), rtol=1e-5, atol=1e-6)
    a, b = _drafter_weights(root / "full" / "run"), _drafter_weights(root / "split" / "run")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["hf", "static"])
def test_moe_export_and_lossless_eval(trained, tmp_path, engine):
    """The trained drafter exported, then ``dflash-train eval`` on the MoE target loaded from a
    folder (as a user runs it): greedy speculative decoding equals plain greedy token for token."""
    from transformers import AutoTokenizer

    root, _ = trained
    target_dir = root / "target"
    if not target_dir.exists():
        moe_chat_target().model.save_pretrained(target_dir)
        AutoTokenizer.from_pretrained(SMOLLM2).save_pretrained(target_dir)
    drafter_dir = tmp_path / "drafter"
    assert main(["export", str(root / "full" / "run"), str(drafter_dir), "--dtype", "float32"]) == 0
    (tmp_path / "prompts.txt").write_text("Tell me story 3.\n\nTell me story 7.\n")
    out = tmp_path / "eval"
    assert main(["eval", "--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts",
                 str(tmp_path / "prompts.txt"), "--max-new-tokens", "16", "--device", "cpu", "--dtype", "float32",
                 "--engine", engine, "--out", str(out)]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["lossless"]["checked"] and report["lossless"]["ok"] and report["num_prompts"] == 2
    assert report["engine"] == engine and report["mean_tau"] >= 1.0
