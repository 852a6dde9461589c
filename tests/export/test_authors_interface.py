"""The exported class is a drop-in for the DFlash authors' ``DFlashDraftModel``.

Their interface (github.com/z-lab/dflash, ``dflash/model.py``): ``forward(position_ids,
attention_mask, noise_embedding, target_hidden, past_key_values, use_cache, **kwargs)``
returning the block's final-normed hidden states, a ``DynamicCache`` as the drafter cache,
and ``spec_generate(target, input_ids, max_new_tokens, stop_token_ids, temperature)``
returning ``[1, prompt + new]`` ids, cut after the first stop token.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, DynamicCache

from dflash_train.decoding.speculative import (
    DrafterContextCache,
    speculative_generate,
    target_generate,
)
from dflash_train.export.serving import export_drafter
from dflash_train.models.attention import decode_masks
from dflash_train.models.target import Target

_spec = importlib.util.spec_from_file_location("_dflash_root_conftest_authors", Path(__file__).parents[1] / "conftest.py")
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
tiny_qwen3, tiny_drafter, SMOLLM2 = _root.tiny_qwen3, _root.tiny_drafter, _root.SMOLLM2

VARIANTS = {
    "plain": {},
    "sliding": dict(num_layers=3, layer_types=["full_attention", "sliding_attention", "full_attention"],
                    sliding_window=3, num_target_features=3),
}


def exported(tmp_path, target, dtype=torch.float32, **kw):
    drafter, cfg = tiny_drafter(target, **kw)
    out = export_drafter(drafter.eval(), cfg, tmp_path / "export", dtype=dtype)
    model = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
    return drafter.eval(), cfg, model, out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_authors_forward_call_with_dynamic_cache(tmp_path, variant):
    """Three drafting steps called the way the authors' decoder calls the model (keyword
    arguments, position_ids = [uncached context ; block], a DynamicCache cropped to the
    committed length after each draft) equal our drafter run with our own cache and
    the masks of our eval (sliding layers: window + causal block)."""
    target = Target(tiny_qwen3())
    drafter, cfg, model, _ = exported(tmp_path, target, block_size=4, **VARIANTS[variant])
    b, h = cfg.block_size, cfg.hidden_size * len(cfg.target_layer_ids)
    g = torch.Generator().manual_seed(0)
    hf_cache, ours = DynamicCache(), DrafterContextCache()
    start, new = 0, 6
    for _step in range(3):
        start += new
        feats = torch.randn(1, new, h, generator=g)
        embeds = torch.randn(1, b, cfg.hidden_size, generator=g)
        positions = torch.arange(hf_cache.get_seq_length(), start + b).unsqueeze(0)
        with torch.no_grad():
            got = model(target_hidden=feats, noise_embedding=embeds, position_ids=positions,
                        past_key_values=hf_cache, use_cache=True, is_causal=False)[:, 1 - b:, :]
            want = drafter(embeds, feats, torch.arange(start, start + b)[None], torch.arange(start - new, start)[None],
                           masks=decode_masks(drafter.layer_types, start, start, b, drafter.sliding_window),
                           cache=ours)[:, 1:]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert hf_cache.get_seq_length() == start  # context only: the authors' crop(start) removes nothing
        hf_cache.crop(0)  # what crop(start) is on a transformers that takes "tokens to remove"
        new = 2 + _step


def test_both_call_forms_dispatch(tmp_path):
    target = Target(tiny_qwen3())
    drafter, cfg, model, _ = exported(tmp_path, target)
    g = torch.Generator().manual_seed(1)
    embeds, feats = torch.randn(1, 4, 64, generator=g), torch.randn(1, 5, 128, generator=g)
    bpos, cpos = torch.arange(5, 9)[None], torch.arange(5)[None]
    with torch.no_grad():
        ours = model(embeds, feats, bpos, cpos)
        theirs = model(torch.arange(9)[None], None, embeds, feats)  # the authors' positional order
        torch.testing.assert_close(ours, drafter(embeds, feats, bpos, cpos), rtol=0, atol=1e-6)
        torch.testing.assert_close(theirs, ours, rtol=0, atol=0)
        with pytest.raises(ValueError, match="expected 5 context \\+ 4 block"):
            model(position_ids=torch.arange(4)[None], noise_embedding=embeds, target_hidden=feats)
        with pytest.raises(ValueError, match="not causal"):
            model(position_ids=torch.arange(9)[None], noise_embedding=embeds, target_hidden=feats, is_causal=True)


# -- spec_generate on a tiny target, with an oracle that controls acceptance ---------------------------------


def test_spec_generate_acceptance_and_stop_rule(tmp_path):
    """Greedy output equals plain greedy decoding; acceptance lengths follow the oracle's
    correct drafts; the output stops after the first stop token or at max_new_tokens."""
    model_t = tiny_qwen3(hidden=64, vocab=64, num_layers=6)
    with torch.no_grad():  # an orthogonal lm_head, so a drafter state selects its token exactly
        model_t.lm_head.weight.copy_(torch.linalg.qr(torch.randn(64, 64))[0] * 8)
    target = Target(model_t)
    _, cfg, model, _ = exported(tmp_path, target, block_size=4)
    head = model_t.lm_head.weight
    prompt = torch.tensor([[3, 17, 5, 9, 22]])
    plain = target_generate(target, prompt, 40).tokens
    pattern = [2, 3, 0, 1, 3]
    real = type(model).dflash_forward.__get__(model)
    for max_new in (1, 2, 7, 30):
        steps = []

        def forward(steps=steps, **kwargs):
            states = real(**kwargs)
            b = states.shape[1]
            p = int(kwargs["position_ids"][0, -b])
            good = pattern[len(steps) % len(pattern)]
            steps.append(good)
            drafts = [plain[p + k - 5] if k <= good else (plain[p + k - 5] + 1) % 64 for k in range(1, b)]
            out = states.clone()
            out[0, 1:] = head[torch.tensor(drafts)]
            return out

        model.dflash_forward = forward
        stats = model.spec_generate(target=model_t, input_ids=prompt, max_new_tokens=max_new, stop_token_ids=None,
                                    temperature=0.0, return_stats=True)
        assert stats.output_ids[0, :5].tolist() == prompt[0].tolist()
        assert stats.output_ids[0, 5:].tolist() == plain[:max_new]
        assert stats.num_output_tokens == max_new
        # independent bookkeeping: step k accepts pattern[k] drafts and adds one target token
        expected, made = [], 1
        while made < max_new:
            expected.append(pattern[len(expected) % len(pattern)] + 1)
            made += expected[-1]
        assert stats.acceptance_lengths == expected, max_new
        assert len(steps) == len(expected)
    del model.dflash_forward
    # stop rule: cut right after the first stop token, wherever it falls inside a block
    for i in (0, 3, 6):
        stop = plain[i]
        first = plain.index(stop)
        out = model.spec_generate(target=model_t, input_ids=prompt, max_new_tokens=30, stop_token_ids=[stop],
                                  temperature=0.0)
        assert out[0, 5:].tolist() == plain[: first + 1]
    assert model.spec_generate(model_t, prompt, 0, None, 0.0).tolist() == prompt.tolist()  # positional, as theirs


class _PatternOracle:
    """A core-loop proposer that drafts as the patched wrapper below does: at the block anchored at
    ``p``, the first ``pattern[step]`` drafts are the target's greedy tokens and the rest wrong."""

    feature_layer_ids: list = []

    def __init__(self, plain, pattern, prompt_len, block_size, vocab):
        self.plain, self.pattern, self.prompt_len, self.block_size, self.vocab = plain, pattern, prompt_len, \
            block_size, vocab
        self.anchors = []

    def reset(self):
        self.anchors.clear()

    def propose(self, tokens, new_features, num_draft):
        p = len(tokens) - 1
        good = self.pattern[len(self.anchors) % len(self.pattern)]
        self.anchors.append(p)
        drafts = [self.plain[p + k - self.prompt_len] if k <= good else
                  (self.plain[p + k - self.prompt_len] + 1) % self.vocab for k in range(1, num_draft + 1)]
        return torch.nn.functional.one_hot(torch.tensor(drafts), self.vocab).float()


@pytest.mark.parametrize(("max_new", "stop_at"), [(1, None), (2, None), (7, None), (30, None), (30, 3), (30, 6)])
def test_spec_generate_is_the_core_loop_token_for_token_and_step_for_step(tmp_path, max_new, stop_at):
    """The shipped ``spec_generate`` (self-contained: it cannot import our loop) against
    :func:`~dflash_train.decoding.core.speculative_loop` (through ``speculative_generate``), with
    drafters that accept the same pattern: the same tokens, the same verify steps at the same
    anchors, the same acceptance per step, and the same end (the budget, or a stop token inside a
    block, which both cut after)."""
    model_t = tiny_qwen3(hidden=64, vocab=64, num_layers=6)
    with torch.no_grad():  # an orthogonal lm_head, so a drafter state selects its token exactly
        model_t.lm_head.weight.copy_(torch.linalg.qr(torch.randn(64, 64))[0] * 8)
    target = Target(model_t)
    _, _, model, _ = exported(tmp_path, target, block_size=4)
    head, prompt = model_t.lm_head.weight, torch.tensor([[3, 17, 5, 9, 22]])
    plain, pattern = target_generate(target, prompt, 40).tokens, [2, 3, 0, 1, 3]
    stop = [] if stop_at is None else [plain[stop_at]]
    real, wrapper_anchors = type(model).dflash_forward.__get__(model), []

    def forward(**kwargs):
        states = real(**kwargs)
        b = states.shape[1]
        p = int(kwargs["position_ids"][0, -b])
        good = pattern[len(wrapper_anchors) % len(pattern)]
        wrapper_anchors.append(p)
        drafts = [plain[p + k - 5] if k <= good else (plain[p + k - 5] + 1) % 64 for k in range(1, b)]
        out = states.clone()
        out[0, 1:] = head[torch.tensor(drafts)]
        return out

    model.dflash_forward = forward
    stats = model.spec_generate(target=model_t, input_ids=prompt, max_new_tokens=max_new, stop_token_ids=stop or None,
                                temperature=0.0, return_stats=True)
    oracle = _PatternOracle(plain, pattern, 5, 4, 64)
    core = speculative_generate(target, oracle, prompt, max_new, stop_token_ids=stop)

    assert stats.output_ids[0, 5:].tolist() == core.tokens and stats.num_output_tokens == len(core.tokens)
    assert wrapper_anchors == oracle.anchors and len(wrapper_anchors) == core.num_steps
    assert stats.acceptance_lengths == core.acceptance_lengths
    assert sum(core.kept_lengths) == len(core.tokens) - 1


def test_spec_generate_sampling_runs(tmp_path):
    target = Target(tiny_qwen3())
    _, _, model, _ = exported(tmp_path, target)
    torch.manual_seed(0)
    out = model.spec_generate(target=target.model, input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=9,
                              stop_token_ids=[], temperature=0.8)
    assert out.shape == (1, 12) and out[0, :3].tolist() == [1, 2, 3]


# -- the real SmolLM2 target ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    if not (SMOLLM2 / "config.json").exists():
        pytest.skip("SmolLM2 assets not prepared (make assets)")
    target = Target.load(SMOLLM2, dtype=torch.float32, device="cpu")
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    ids = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return target, ids


def _record_norm_outputs(module):
    seen = []
    handle = module.norm.register_forward_hook(lambda _m, _a, out: seen.append(out.detach().clone()))
    return seen, handle


def test_spec_generate_equals_dflash_train_eval_on_smollm2(tmp_path, smollm2):
    """AutoModel.from_pretrained(export).spec_generate gives the tokens, the acceptance lengths and,
    step by step, the drafter states of `dflash-train eval`'s decoders (greedy, float32)."""
    from dflash_train.decoding.static import StaticDecoder
    from dflash_train.eval.loader import load_drafter_folder

    target, ids = smollm2
    drafter, cfg = tiny_drafter(target, num_layers=2, block_size=4, num_target_features=3)
    out = export_drafter(drafter, cfg, tmp_path / "export", dtype=torch.float32,
                         tokenizer=target.tokenizer)
    model = AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    assert model.fc.weight.dtype == torch.float32
    ours = load_drafter_folder(out, target)  # exactly what `dflash-train eval` loads
    stop = [target.tokenizer.eos_token_id]

    seen_eval, h1 = _record_norm_outputs(ours)
    reference = speculative_generate(target, ours, ids, 12, stop_token_ids=stop)
    h1.remove()
    seen_export, h2 = _record_norm_outputs(model)
    stats = model.spec_generate(target=target.model, input_ids=ids, max_new_tokens=12, stop_token_ids=stop,
                                temperature=0.0, return_stats=True)
    h2.remove()
    static = StaticDecoder(target, ours, max_len=ids.shape[1] + 12 + 8).speculative(ids, 12, stop)

    assert stats.output_ids[0, ids.shape[1]:].tolist() == reference.tokens == static.tokens
    assert stats.output_ids[0, : ids.shape[1]].tolist() == ids[0].tolist()
    assert stats.acceptance_lengths == reference.acceptance_lengths == static.acceptance_lengths
    assert len(seen_export) == len(seen_eval) == len(reference.acceptance_lengths) > 3
    for got, want in zip(seen_export, seen_eval):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_readme_call_on_a_bf16_export(tmp_path, smollm2):
    """The authors' README call, verbatim in form, on our default (bfloat16) export with a
    float32 target: runs, keeps the prompt, and (greedy, float32 verification) equals plain decoding."""
    target, input_ids = smollm2
    drafter, cfg = tiny_drafter(target, num_layers=1, block_size=4)
    folder = export_drafter(drafter, cfg, tmp_path / "export", tokenizer=target.tokenizer)
    tokenizer, hf_target = target.tokenizer, target.model

    draft = AutoModel.from_pretrained(str(folder), trust_remote_code=True, dtype="auto").eval()
    output = draft.spec_generate(input_ids=input_ids, max_new_tokens=12, temperature=0.0, target=hf_target,
                                 stop_token_ids=[tokenizer.eos_token_id])
    text = tokenizer.decode(output[0], skip_special_tokens=False)

    assert draft.fc.weight.dtype == torch.bfloat16
    assert isinstance(text, str) and output[0, : input_ids.shape[1]].tolist() == input_ids[0].tolist()
    plain = target_generate(target, input_ids, 12, stop_token_ids=[tokenizer.eos_token_id]).tokens
    assert output[0, input_ids.shape[1]:].tolist() == plain
