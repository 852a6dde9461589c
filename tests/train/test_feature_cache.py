"""The per-conversation feature cache: exact features for any later packing, no target
forward once a micro-batch is all cached, and training equal to training without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict, load_config
from dflash_train.data.batching import MicroBatch
from dflash_train.models.attention import document_layout
from dflash_train.train import trainer as trainer_module
from dflash_train.train.features import LocalFeatures, SampleFeatureCache, cache_gib_for, free_device_gib
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
LENGTHS = [3, 5, 2, 4]


class FakeTarget:
    """Features that name their token: (conversation id, position in it); padding gets 7s,
    which a cache must not hand back (it returns zeros there)."""

    def __init__(self):
        self.calls = 0

    def features(self, micro_batch, input_ids, attention_mask):
        self.calls += 1
        docs = _docs(micro_batch)
        _, positions = document_layout(docs)
        real = (docs >= 0)[..., None]
        return torch.where(real, torch.stack([docs, positions], -1).float(), torch.full((), 7.0))


def _docs(mb: MicroBatch) -> torch.Tensor:
    if mb.doc_ids is not None:
        return mb.doc_ids
    return torch.where(mb.attention_mask.bool(), mb.sample_ids[:, None], -1)


def packed(rows: list[list[int]], seq: int = 10) -> MicroBatch:
    doc_ids = torch.full((len(rows), seq), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for sample in row:
            doc_ids[r, at:at + LENGTHS[sample]] = sample
            at += LENGTHS[sample]
    mask = (doc_ids >= 0).long()
    return MicroBatch(torch.zeros_like(doc_ids), mask, mask, torch.tensor([row[0] for row in rows]), 0, doc_ids)


def unpacked(samples: list[int], seq: int = 6) -> MicroBatch:
    mask = torch.zeros(len(samples), seq, dtype=torch.long)
    for r, sample in enumerate(samples):
        mask[r, :LENGTHS[sample]] = 1
    return MicroBatch(torch.zeros_like(mask), mask, mask, torch.tensor(samples), 0)


def expected(mb: MicroBatch) -> torch.Tensor:
    docs = _docs(mb)
    _, positions = document_layout(docs)
    return torch.stack([docs, positions], -1).float() * (docs >= 0)[..., None]


def serve(cache, mb):
    return cache.features(mb, mb.input_ids, mb.attention_mask)


def test_cached_features_follow_any_later_packing():
    target = FakeTarget()
    cache = SampleFeatureCache(target, LENGTHS, width=2, dtype=torch.float32, device="cpu")
    first = [packed([[0, 1], [2]]), unpacked([3])]  # "epoch 1": every conversation once
    for mb in first:
        torch.testing.assert_close(serve(cache, mb)[_docs(mb) >= 0], expected(mb)[_docs(mb) >= 0])
    assert (target.calls, cache.misses, cache.hits) == (2, 2, 0)
    for mb in (packed([[2, 0], [3, 1]]), packed([[1, 2, 0]]), unpacked([1, 3])):  # other packings: no forward
        torch.testing.assert_close(serve(cache, mb), expected(mb))  # zeros on padding, not the source's 7s
    assert (target.calls, cache.hits) == (2, 3)


def test_a_micro_batch_with_an_unseen_conversation_runs_the_target():
    target = FakeTarget()
    cache = SampleFeatureCache(target, LENGTHS, width=2, dtype=torch.float32, device="cpu")
    serve(cache, packed([[0, 1]]))
    out = serve(cache, packed([[1, 2]]))  # 2 is new: the whole micro-batch comes from the target
    assert target.calls == 2 and cache.hits == 0
    assert (out == 7).any()  # the source's own output, padding included
    torch.testing.assert_close(serve(cache, packed([[2], [1]])), expected(packed([[2], [1]])))
    assert target.calls == 2 and cache.hits == 1


def _spilling(target, device_tokens: int) -> SampleFeatureCache:
    """A cache holding only its first ``device_tokens`` tokens in its "device" store (width 2,
    float32: 8 bytes a token); the rest spills to host memory."""
    return SampleFeatureCache(target, LENGTHS, width=2, dtype=torch.float32, device="cpu",
                              device_gib=device_tokens * 8 / 2**30)


@pytest.mark.parametrize("ahead", [True, False], ids=["gathered-ahead", "gathered-in-step"])
def test_spilled_rows_are_served_like_rows_on_the_device(ahead):
    """6 of the 14 tokens in the device store (conversation 0 and part of 1), 8 spilled: every
    later packing gets exactly its features back, whether the prefetching thread gathered the
    spilled rows ahead (``prefetch``) or the step does."""
    target = FakeTarget()
    cache = _spilling(target, 6)
    assert (cache.store.shape[0], cache.spill.shape[0]) == (6, 8)
    early = packed([[1, 3]])
    cache.prefetch(early)  # not cached yet: nothing may be gathered (it would read unwritten rows)
    assert "cache_spill" not in early.host
    for mb in (packed([[0, 1], [2]]), unpacked([3])):
        serve(cache, mb)
    assert (target.calls, cache.misses) == (2, 2)
    for mb in (early, packed([[2, 0], [3, 1]]), packed([[1, 2, 0]]), unpacked([1, 3]), unpacked([0])):
        if ahead:
            cache.prefetch(mb)
            assert ("cache_spill" in mb.host) == bool(cache.layout(mb).spill_rows.numel())
        torch.testing.assert_close(serve(cache, mb), expected(mb))
        assert "cache_spill" not in mb.host  # consumed by the step
    assert (target.calls, cache.hits) == (2, 5)
    assert cache.report()["host_gib"] == round(8 * 8 / 2**30, 2) and "host memory" in cache.describe()


def test_a_cache_with_nothing_on_the_device_or_everything():
    for device_tokens, spilled in ((0, 14), (100, 0)):
        cache = _spilling(FakeTarget(), device_tokens)
        assert cache.spill.shape[0] == spilled and cache.store.shape[0] == 14 - spilled
        serve(cache, packed([[0, 1], [2, 3]]))
        mb = packed([[3, 2], [1, 0]])
        torch.testing.assert_close(serve(cache, mb), expected(mb))
        assert cache.hits == 1


def test_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="feature_cache must be off, device, cpu or disk"):
        load_config("cpu-demo", ["train.feature_cache=gpu"])
    with pytest.raises(ValueError, match="feature_cache stores features only"):
        load_config("cpu-demo", ["train.feature_cache=device", "objective.targets={ce: 0.5, kl: 0.5}"])
    assert load_config("cpu-demo", ["train.feature_cache=cpu"]).train.feature_cache == "cpu"
    # YAML 1.1 reads a bare off as False: the text field gets its word back (it was refused as False)
    assert load_config("smollm2-1gpu", ["train.feature_cache=off"]).train.feature_cache == "off"
    written = tmp_path / "job.yaml"
    written.write_text("target: {path: assets/smollm2}\ndata: {paths: [chat.jsonl]}\ntrain: {feature_cache: off}\n")
    assert load_config(str(written)).train.feature_cache == "off"
    with pytest.raises(ValueError, match="disaggregated topology streams them"):  # a source given by the caller
        trainer_module.Trainer(config_from_dict(tiny_chat_job(tmp_path, feature_cache="device")),
                               target=tiny_chat_target(SMOLLM2), echo=lambda *a: None, features=LocalFeatures)
    assert load_config("smollm2-1gpu", ["train.feature_cache_gib=100"]).train.feature_cache_gib == 100
    with pytest.raises(ValueError, match="caps the GPU part of train.feature_cache=device"):
        load_config("cpu-demo", ["train.feature_cache=cpu", "train.feature_cache_gib=4"])
    with pytest.raises(ValueError, match="feature_cache_gib must be >= 0"):
        load_config("smollm2-1gpu", ["train.feature_cache_gib=-1"])
    with pytest.raises(ValueError, match="could not be allocated"):
        SampleFeatureCache(FakeTarget(), [2**40], width=2**10, dtype=torch.float32, device="cpu")


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize("spill", [False, True], ids=["all-on-device", "half-spilled"])
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
def test_training_with_the_cache_equals_training_without(tmp_path, monkeypatch, pack, spill):
    """Three epochs of the tiny chat job: the same losses step for step, and after the
    first epoch the target runs no more (all micro-batches served from the cache), also with
    half the cache spilled to host memory (``train.feature_cache_gib``, read ahead by the
    prefetching thread)."""
    made = []

    class Recording(SampleFeatureCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(trainer_module, "SampleFeatureCache", Recording)
    curves = {}
    for where in ("off", "device"):
        job = tiny_chat_job(tmp_path / where, max_steps=30, feature_cache=where)
        job["data"]["pack"] = pack
        if spill and where == "device":
            job["train"]["feature_cache_gib"] = _half_the_cache(job)
            made.clear()  # the probe's cache
        summary = train(config_from_dict(job), target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
        assert summary["steps"] == 30
        assert ("feature_cache" in summary) == (where != "off")
        curves[where] = _losses(tmp_path / where / "run")
    (cache,) = made
    assert cache.hits > 0 and cache.misses > 0 and bool(cache.cached.all())
    assert summary["feature_cache"] == {"hits": cache.hits, "misses": cache.misses, "gib": round(cache.gib, 2),
                                        "host_gib": round(cache.host_gib, 2)}
    assert (cache.spill.shape[0] > 0) == spill and cache.store.shape[0] > 0
    torch.testing.assert_close(torch.tensor(curves["device"]), torch.tensor(curves["off"]), rtol=1e-5, atol=1e-5)


def _half_the_cache(job: dict) -> float:
    """GiB of half the tiny chat job's cache (its tokens x feature width, float32)."""
    from dflash_train.train.trainer import Trainer

    probe = Trainer(config_from_dict({**job, "train": {**job["train"], "feature_cache": "device"}}),
                    target=tiny_chat_target(SMOLLM2), echo=lambda *a: None)
    return probe.source.gib / 2


def test_the_default_gpu_part_of_the_cache_is_the_free_memory_less_the_steps_headroom():
    """``train.feature_cache_gib: null`` on a GPU: free memory less 12% of the card (at least 8 GiB),
    so one recipe runs on an H200 and an H100 alike (the H200's 124 GiB was 141 less 17)."""
    gib = 2**30
    assert cache_gib_for(139 * gib, 141 * gib) == pytest.approx(139 - 0.12 * 141)  # an H200: ~122 GiB
    assert cache_gib_for(78 * gib, 80 * gib) == pytest.approx(78 - 9.6)  # an H100 80GB: ~68 GiB
    assert cache_gib_for(20 * gib, 24 * gib) == pytest.approx(12.0)  # a small card keeps at least 8 GiB
    assert cache_gib_for(5 * gib, 24 * gib) == 0.0  # no room: every row spills to host memory
    assert free_device_gib(torch.device("cpu")) is None  # off CUDA: no cap, the cache lives where it is put
