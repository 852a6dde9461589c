"""The static decoder's faster paths decode exactly like the reference loops (CPU, float32).

* grouped-query attention without ``repeat_kv`` equals the stock SDPA path;
* the compiled steps (``torch.compile``, inductor) on the real SmolLM2-135M give plain
  greedy's tokens and the reference loop's acceptance lengths.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.decoding.grouped import NAME, grouped_attention, grouped_sdpa
from dflash_train.decoding.speculative import speculative_generate, target_generate
from dflash_train.decoding.static import StaticDecoder
from dflash_train.models.target import Target

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"


class _Module:  # what HF's attention functions read from the calling layer
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("q_len", [1, 5])
def test_grouped_attention_equals_repeat_kv(q_len):
    """Each query head must meet K/V head ``head // group``, as ``repeat_kv`` pairs them;
    a wrong pairing or mask row order changes the output by O(1)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 9, q_len, 16), torch.randn(1, 3, 24, 16), torch.randn(1, 3, 24, 16)
    visible = torch.rand(1, 1, q_len, 24) < 0.6
    visible[..., 0] = True
    mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    ref, _ = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=0.25)
    out, _ = grouped_attention(_Module(), q, k, v, mask, scaling=0.25)
    assert out.shape == ref.shape == (1, q_len, 9, 16)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


def test_grouped_sdpa_switches_and_restores():
    model = tiny_qwen3(vocab=64)
    before = model.config._attn_implementation
    with grouped_sdpa(model) as on:
        assert on == (before == "sdpa") and model.config._attn_implementation == (NAME if on else before)
    assert model.config._attn_implementation == before


@pytest.fixture(scope="module")
def smollm2():
    if not (SMOLLM2 / "config.json").exists():
        pytest.skip("assets/smollm2 missing")
    return Target.load(SMOLLM2, dtype=torch.float32)


@pytest.mark.slow  # ~4 min on 2 CPU cores: inductor compiles three steps of a 30-layer model
def test_compiled_static_decoder_equals_reference_on_smollm2(smollm2):
    """Inductor may reorder float32 reductions; greedy tokens and acceptance lengths must
    not move (the lossless check compares with tolerance 0). ``warnings`` as errors: a
    compile failure would fall back silently to the uncompiled step."""
    target = smollm2
    drafter, _ = tiny_drafter(target, num_layers=2, block_size=4, seed=5)
    drafter.eval()
    decoder = StaticDecoder(target, drafter, max_len=64, compile=True)
    texts = ["The capital of France is", "def fibonacci(n):"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for text in texts:
            ids = target.tokenizer(text, return_tensors="pt").input_ids
            ref = speculative_generate(target, drafter, ids, 16)
            out = decoder.speculative(ids, 16)
            assert out.tokens == ref.tokens == target_generate(target, ids, 16).tokens
            assert out.acceptance_lengths == ref.acceptance_lengths
            assert decoder.plain(ids, 16).tokens == ref.tokens
    assert all(s.compiled and s.warm for s in (decoder.verify_step, decoder.plain_step, decoder.draft_step))


def test_compile_option_is_checked():
    target = Target(tiny_qwen3(vocab=64))
    with pytest.raises(ValueError, match="compile"):
        StaticDecoder(target, tiny_drafter(target, block_size=4)[0], max_len=32, compile="turbo")


def test_fused_projections_decode_like_reference_and_restore(smollm2):
    """One GEMM per q/k/v and gate/up group: a wrong split (sizes, order) changes every
    token; the original projections must be back after decoding."""
    from dflash_train.decoding.fused import _Lead

    target = smollm2
    drafter, _ = tiny_drafter(target, num_layers=1, block_size=4, seed=6)
    decoder = StaticDecoder(target, drafter.eval(), max_len=64, mode="eager", fuse_projections=True)
    assert len(decoder.fused.swaps) == 5 * len(target.layers)
    ids = target.tokenizer("Water boils at", return_tensors="pt").input_ids
    ref = speculative_generate(target, drafter, ids, 12)
    out = decoder.speculative(ids, 12)
    assert out.tokens == ref.tokens == target_generate(target, ids, 12).tokens
    assert out.acceptance_lengths == ref.acceptance_lengths
    assert decoder.plain(ids, 12).tokens == ref.tokens
    assert all(len(rep.shared.parts) > 0 for _, _, _, rep in decoder.fused.swaps)  # the fused path ran
    assert isinstance(target.layers[0].self_attn.q_proj, torch.nn.Linear)
    assert not any(isinstance(m, _Lead) for m in target.modules())


def test_fused_projections_refuse_out_of_order_calls():
    """A layer calling k_proj on another input than q_proj's must fail loudly, not read
    the previous call's parts."""
    from dflash_train.decoding.fused import FusedProjections

    model = tiny_qwen3(vocab=64)
    layers = Target(model).layers
    fused = FusedProjections(layers)
    attn = layers[0].self_attn
    x = torch.randn(1, 3, attn.q_proj.in_features)
    with fused.applied():
        q = attn.q_proj(x)
        torch.testing.assert_close(attn.k_proj(x), torch.nn.functional.linear(x, fused.swaps[1][2].weight))
        assert q.shape[-1] == fused.swaps[0][2].out_features
        with pytest.raises(RuntimeError, match="another input"):
            attn.v_proj(x.clone())
    assert attn.q_proj is fused.swaps[0][2]


def _hook_counts(target) -> list[int]:
    return [len(layer._forward_hooks) for layer in target.layers]


def test_decoders_never_add_or_remove_hooks_after_the_first():
    """Each feature layer gets one hook for the target's life. Decoders used to register
    their own and remove them when garbage-collected; a decoder in a reference cycle is
    collected at an arbitrary allocation, also in the middle of another decoder's
    ``torch.compile`` trace, which then failed (seen on an H200: a guard's IndexError, a
    traced cat of a stale tensor)."""
    import gc

    target = Target(tiny_qwen3(vocab=64))
    drafter = tiny_drafter(target, block_size=4, seed=2)[0].eval()
    before = _hook_counts(target)
    StaticDecoder(target, drafter, max_len=32, mode="eager")
    after_first = _hook_counts(target)
    assert sum(after_first) - sum(before) == len(set(drafter.config.target_layer_ids))
    for _ in range(2):
        StaticDecoder(target, drafter, max_len=32, mode="eager")
        gc.collect()
        assert _hook_counts(target) == after_first


def test_a_decoder_collected_while_another_compiles_breaks_nothing():
    """The failure itself, forced: a compiled decoder is dropped (it sits in a reference
    cycle, so only the garbage collector frees it), and the collector runs in the middle of
    the next decoder's compile, between dynamo's trace and its guards (where it struck on
    the GPU). With per-decoder hooks removed at collection this failed to compile
    (``IndexError`` while creating a guard)."""
    import gc

    import torch._inductor.config as inductor_config

    target = Target(tiny_qwen3(vocab=64))
    drafter = tiny_drafter(target, block_size=4, seed=2)[0].eval()
    ids = torch.tensor([[5, 9, 3, 17, 2]])
    ref = speculative_generate(target, drafter, ids, 12)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="static eval")
        first = StaticDecoder(target, drafter, max_len=48, mode="eager", compile=True, compile_steps=("verify",))
        assert first.speculative(ids, 12).tokens == ref.tokens
        del first
        second = StaticDecoder(target, drafter, max_len=48, mode="eager", compile=True, compile_steps=("verify",),
                               fuse_projections=True)
        with inductor_config.patch(post_grad_custom_pre_pass=lambda graph: gc.collect()):
            out = second.speculative(ids, 12)
    assert out.tokens == ref.tokens and out.acceptance_lengths == ref.acceptance_lengths
    assert second.verify_step.compiled
