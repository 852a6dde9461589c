"""Static-cache batched generation: exact greedy agreement with HF, sampling, eos/length, regenerate path."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from testkit import tiny_qwen3  # noqa: E402

from dflash_train.decoding.batched import StaticCacheGenerator  # noqa: E402
from dflash_train.decoding.generators import SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "assets" / "smollm2"
needs_smollm2 = pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="assets/smollm2 missing")


def hf_greedy(model, prompt: list[int], n: int, stop: set[int]) -> list[int]:
    """Plain unbatched greedy loop without a cache: the reference."""
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(tok)
            ids.append(tok)
            if tok in stop:
                break
    return out


def test_tiny_qwen3_greedy_matches_plain_loop():
    model = tiny_qwen3(num_layers=3, hidden=64, vocab=128, seed=1).float()
    g = StaticCacheGenerator(model=model, stop_ids={7}, pad_multiple=8, length_multiple=16)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(8, 128, (n,), generator=gen).tolist() for n in (3, 11, 17, 5, 29, 1)]
    outs = g.generate_ids(prompts, SamplingParams(max_new_tokens=12))
    for p, o in zip(prompts, outs):
        assert o == hf_greedy(model, p, 12, {7})
    assert g.stats.new_tokens == sum(map(len, outs)) and g.stats.tokens_per_s > 0


def test_tiny_qwen3_many_buckets_and_row_chunked_prefill():
    model = tiny_qwen3(num_layers=2, hidden=64, vocab=128, seed=2).float()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(8, 128, (int(n),), generator=gen).tolist()
               for n in torch.randint(1, 40, (13,), generator=gen)]
    ref = StaticCacheGenerator(model=model, stop_ids={7}).generate_ids(prompts, SamplingParams(max_new_tokens=9))
    # tiny buckets (3 rows), padded row counts, prefill in chunks of 2 rows, early-exit checks every 2 steps
    g = StaticCacheGenerator(model=model, stop_ids={7}, max_batch=3, batch_multiple=2, prefill_tokens=64,
                             check_every=2)
    assert g.generate_ids(prompts, SamplingParams(max_new_tokens=9)) == ref
    assert g.stats.buckets >= 5
    for p, o in zip(prompts[:4], ref[:4]):
        assert o == hf_greedy(model, p, 9, {7})


@pytest.mark.parametrize("multiple", [1, 4], ids=["exact-rows", "rows-padded-to-4"])
def test_compaction_keeps_every_answer(multiple):
    """``compact``: once at most half of a bucket's rows run, they move to the front of the K/V
    buffers and decode at a smaller batch (several times per bucket here). Every answer equals
    the plain loop's and the uncompacted generator's; the decode steps cost fewer row-steps."""
    model = tiny_qwen3(num_layers=2, hidden=64, vocab=128, seed=4).float()
    stop = set(range(8, 30))  # many stop ids: answers end at many different lengths
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(30, 128, (int(n),), generator=gen).tolist()
               for n in torch.randint(1, 20, (24,), generator=gen)]
    params = SamplingParams(max_new_tokens=24)
    kwargs = dict(stop_ids=stop, max_batch=12, batch_multiple=multiple, check_every=2)
    plain = StaticCacheGenerator(model=model, **kwargs)
    compact = StaticCacheGenerator(model=model, compact=True, **kwargs)
    ref = plain.generate_ids(prompts, params)
    assert compact.generate_ids(prompts, params) == ref
    assert len({len(o) for o in ref}) > 5  # the test needs answers of many lengths
    for p, o in zip(prompts, ref):
        assert o == hf_greedy(model, p, 24, stop)
    assert compact.stats.compactions >= 2 and plain.stats.compactions == 0
    assert compact.stats.row_steps < plain.stats.row_steps
    assert compact.stats.new_tokens == plain.stats.new_tokens


def test_sampling_respects_eos_and_max_new_tokens():
    model = tiny_qwen3(num_layers=2, hidden=64, vocab=16, seed=3).float()
    stop = {3}
    g = StaticCacheGenerator(model=model, stop_ids=stop, check_every=4)
    torch.manual_seed(0)
    prompts = [[5, 6, 7], [9] * 10, [4, 12]] * 4
    for top_p in (1.0, 0.8):
        outs = g.generate_ids(prompts, SamplingParams(max_new_tokens=20, temperature=1.0, top_p=top_p))
        assert all(1 <= len(o) <= 20 for o in outs)
        for o in outs:  # a stop token can only be the last one; rows without one run to the limit
            assert all(t not in stop for t in o[:-1])
            assert o[-1] in stop or len(o) == 20
        assert any(o[-1] in stop for o in outs) and len({tuple(o) for o in outs}) > 3
    # top_p tiny -> only the argmax survives -> greedy
    greedy = g.generate_ids(prompts, SamplingParams(max_new_tokens=6))
    assert g.generate_ids(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-6)) == greedy


@needs_smollm2
def test_smollm2_greedy_matches_hf_generate():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    g = StaticCacheGenerator(model=model, tokenizer=tok)
    questions = ["Hi", "What is 2+2?", "Explain in detail, step by step, how a refrigerator works for a child."]
    convs = [[{"role": "user", "content": q}] for q in questions]
    gens = g.generate(convs, SamplingParams(max_new_tokens=16))
    for conv, gen in zip(convs, gens):
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        out = model.generate(**enc, max_new_tokens=16, do_sample=False, temperature=None, top_p=None, top_k=None,
                             pad_token_id=tok.pad_token_id)[0, enc["input_ids"].shape[1]:].tolist()
        ref = g._decode(out)
        assert (gen.content, gen.num_tokens) == (ref.content, ref.num_tokens)


def test_regenerate_static_backend(tmp_path):
    """``regenerate --backend static`` end to end on two records (real SmolLM2 when present)."""
    if not (SMOLLM2 / "config.json").exists():
        pytest.skip("assets/smollm2 missing")
    from dflash_train.data.cli import main

    src = tmp_path / "in.jsonl"
    rows = [{"id": "a", "messages": [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": ""}]},
            {"id": "b", "messages": [{"role": "user", "content": "Name a color."},
                                     {"role": "assistant", "content": "old"}]}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    rc = main(["regenerate", "--target", str(SMOLLM2), "--data", str(src), "--out", str(out),
               "--backend", "static", "--max-new-tokens", "6", "--batch-size", "4", "--device", "cpu"])
    assert rc == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["a", "b"]
    for line in lines:
        assert line["messages"][-1]["role"] == "assistant" and line["messages"][-1]["content"] != "old"
    compacted = tmp_path / "compacted.jsonl"  # --compact: the same answers
    assert main(["regenerate", "--target", str(SMOLLM2), "--data", str(src), "--out", str(compacted),
                 "--backend", "static", "--max-new-tokens", "6", "--batch-size", "4", "--device", "cpu",
                 "--compact"]) == 0
    assert compacted.read_text() == out.read_text()


def test_grouped_decode_attention_equals_repeated_kv_sdpa():
    """One query token on K/V heads == the stock path that repeats K/V per query head."""
    from transformers.integrations.sdpa_attention import repeat_kv

    from dflash_train.decoding.batched import grouped_decode_attention

    gen = torch.Generator().manual_seed(0)
    b, kv_heads, group, length, dim = 3, 2, 3, 10, 8
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = group, True
    q = torch.randn(b, kv_heads * group, 1, dim, generator=gen)
    k, v = torch.randn(2, b, kv_heads, length, dim, generator=gen)
    mask = torch.zeros(b, 1, 1, length)
    mask[0, ..., :4] = float("-inf")  # a left-padded row
    out, _ = grouped_decode_attention(module, q, k, v, mask, scaling=0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, group), repeat_kv(v, group),
                                                           attn_mask=mask, scale=0.3).transpose(1, 2)
    assert out.shape == (b, 1, kv_heads * group, dim)
    torch.testing.assert_close(out, ref)
    swapped = grouped_decode_attention(module, q, k.flip(1), v.flip(1), mask, scaling=0.3)[0]
    assert not torch.allclose(swapped, ref)  # the head pairing matters, so the check above can fail
