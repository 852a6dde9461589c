"""The feature store (issue 58): training from a store equals online training step for step (the
target's own dtype), an FP8 store stays within a stated tolerance, and every fault is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from testkit import tiny_chat_job, tiny_chat_target

from dflash_train.config import config_from_dict
from dflash_train.distributed.feature_job import dump
from dflash_train.features import format as fmt
from dflash_train.features.reader import FeatureStore
from dflash_train.files import UserFacingError
from dflash_train.train.loop import train

SMOLLM2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
QUIET = {"echo": lambda *a: None}


def _job(tmp_path, name: str, objective=None, **train_overrides) -> dict:
    return tiny_chat_job(tmp_path / name, objective, **{"max_steps": 12, **train_overrides})


def _dump(job: dict, store: Path, kind: str = "auto", **kw) -> dict:
    return dump(config_from_dict(job), store, kind, target=tiny_chat_target(SMOLLM2), **QUIET, **kw)


def _train(job: dict) -> tuple[list[float], dict]:
    summary = train(config_from_dict(job), target=tiny_chat_target(SMOLLM2), **QUIET)
    rows = [json.loads(line) for line in (Path(job["train"]["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r], summary


def _from_store(job: dict, store: Path) -> dict:
    return {**job, "train": {**job["train"], "feature_store": str(store)}}


@pytest.mark.parametrize("pack", [False, True], ids=["unpacked", "packed"])
def test_training_from_an_auto_store_equals_online_training_bit_for_bit(tmp_path, pack):
    """12 steps (the first epoch's micro-batches, the ones the dump computed): equal losses, exactly."""
    online = _job(tmp_path, "online")
    online["data"]["pack"] = pack
    manifest = _dump(online, tmp_path / "store")
    assert manifest["state"] == "complete" and manifest["encoding"]["stored_dtype"] == "float32"
    assert manifest["bytes"] >= manifest["tokens"] * manifest["encoding"]["bytes_per_token"]
    want, _ = _train(online)
    stored = _from_store(_job(tmp_path, "stored"), tmp_path / "store")
    stored["data"]["pack"] = pack
    got, summary = _train(stored)
    assert len(got) == 12 and got == want
    assert summary["feature_store"]["read_gib"] > 0 and summary["feature_store"]["micro_batches"] == 12


def test_a_bfloat16_target_and_a_bfloat16_store_train_identically(tmp_path):
    job = _job(tmp_path, "online")
    job["target"]["dtype"] = "bfloat16"
    job["train"]["max_steps"] = 6
    _dump(job, tmp_path / "store", "bfloat16")
    want, _ = _train(job)
    stored = _from_store(_job(tmp_path, "stored", max_steps=6), tmp_path / "store")
    stored["target"]["dtype"] = "bfloat16"
    got, _ = _train(stored)
    assert got == want


def test_fp8_rows_decode_within_e4m3_precision():
    """Per token and layer scaled to e4m3's largest value: every element within 2^-4 of itself (3
    mantissa bits) plus the scaled subnormal step, and a zero row stays zero."""
    x = torch.randn(50, 3 * 16) * torch.logspace(-3, 3, 3).repeat_interleave(16)
    x[7] = 0
    parts = fmt.encode(x, None, "float8", layers=3)
    assert parts["features"].dtype == fmt.FP8 and parts["scales"].shape == (50, 3)
    back = fmt.decode(parts, torch.float32, layers=3)
    step = (parts["scales"] * 2.0**-9).repeat_interleave(16, dim=1)
    assert bool(((back - x).abs() <= x.abs() * 2.0**-4 + step).all())
    assert bool((back[7] == 0).all())
    assert fmt.bytes_per_token("float8", torch.bfloat16, 3, 16, False) * 2 - 24 == 3 * 16 * 2


def test_training_from_an_fp8_store_stays_within_tolerance(tmp_path):
    """Stated tolerance: every logged loss within 2% (relative) of online training's over 12 steps."""
    online = _job(tmp_path, "online")
    manifest = _dump(online, tmp_path / "store", "float8")
    assert manifest["encoding"]["stored_dtype"] == "float8_e4m3fn"
    want, _ = _train(online)
    got, _ = _train(_from_store(_job(tmp_path, "stored"), tmp_path / "store"))
    assert got != want  # the store is not exact...
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0.02, atol=0.0)  # ...but close


@pytest.mark.parametrize("kind,objective", [("dflash2", None), ("dspark", {"targets": {"ce": 0.1, "tv": 0.9}}),
                                            ("dflash", {"targets": {"ce": 0.5, "kl": 0.5}})])
def test_every_kind_and_objective_trains_from_a_store(tmp_path, kind, objective):
    """kl/tv read the target's final hidden states: the store keeps them, and the losses stay exact."""
    online = _job(tmp_path, "online", objective, max_steps=4)
    online["drafter"]["kind"] = kind
    manifest = _dump(online, tmp_path / "store")
    assert manifest["job"]["final_hidden"] == (objective is not None)
    want, _ = _train(online)
    stored = _from_store(_job(tmp_path, "stored", objective, max_steps=4), tmp_path / "store")
    stored["drafter"]["kind"] = kind
    got, _ = _train(stored)
    assert got == want


def test_a_store_without_final_states_is_refused_for_a_kl_objective(tmp_path):
    job = _job(tmp_path, "online")
    _dump(job, tmp_path / "store")
    with pytest.raises(UserFacingError, match="holds no final hidden states"):
        _train(_from_store(_job(tmp_path, "kl", {"targets": {"ce": 0.5, "kl": 0.5}}), tmp_path / "store"))


@pytest.mark.parametrize("change,field", [(("data", "max_length", 96), "max_length"),
                                          (("drafter", "target_layer_ids", [0, 2]), "layer_ids"),
                                          (("target", "dtype", "bfloat16"), "target_dtype")])
def test_a_store_of_another_job_is_refused_naming_the_field(tmp_path, change, field):
    _dump(_job(tmp_path, "online"), tmp_path / "store")
    other = _from_store(_job(tmp_path, "other"), tmp_path / "store")
    section, key, value = change
    other[section][key] = value
    with pytest.raises(UserFacingError, match=f"written for another job: {field} differs"):
        _train(other)


def test_another_target_is_refused(tmp_path):
    _dump(_job(tmp_path, "online"), tmp_path / "store")
    other = tiny_chat_target(SMOLLM2)
    with torch.no_grad():
        other.embed_tokens.weight[0] += 1
    with pytest.raises(UserFacingError, match="target_head differs"):
        train(config_from_dict(_from_store(_job(tmp_path, "other"), tmp_path / "store")), target=other, **QUIET)


def test_resume_from_a_store_is_exact(tmp_path):
    from testkit import train_stopped_then_resumed

    _dump(_job(tmp_path, "online"), tmp_path / "store")
    whole, _ = _train(_from_store(_job(tmp_path, "whole"), tmp_path / "store"))
    job = _from_store(_job(tmp_path, "resumed", save_every_steps=0), tmp_path / "store")
    train_stopped_then_resumed(job, 5, lambda: tiny_chat_target(SMOLLM2))
    rows = [json.loads(line) for line in (tmp_path / "resumed" / "run" / "metrics.jsonl").read_text().splitlines()]
    resumed = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert [resumed[s] for s in sorted(resumed)] == whole


# -- faults -----------------------------------------------------------------------------------------------
def _per_sample(store: Path) -> dict[int, int]:
    """Each conversation's CRC, as the store's indexes record them."""
    reader = FeatureStore(store)
    return {int(s): int(reader.crc_of[s]) for s in range(len(reader.crc_of))}


def test_a_killed_dump_continues_and_never_reads_a_half_written_shard(tmp_path, monkeypatch):
    from dflash_train.features import writer

    job = _job(tmp_path, "job")
    _dump(job, tmp_path / "whole", shard_mib=0.05)
    flushed, original = [], writer.ShardWriter.flush

    def dies_at_third(self):
        if len(flushed) == 2:
            raise KeyboardInterrupt  # killed between two shards
        flushed.append(1)
        original(self)

    monkeypatch.setattr(writer.ShardWriter, "flush", dies_at_third)
    with pytest.raises(KeyboardInterrupt):
        _dump(job, tmp_path / "store", shard_mib=0.05)
    monkeypatch.setattr(writer.ShardWriter, "flush", original)
    store = tmp_path / "store"
    assert len((store / "index-r000.jsonl").read_text().splitlines()) == 2
    (store / "r000-000002.safetensors").write_bytes(b"renamed, never indexed")  # killed before its line
    with open(store / "index-r000.jsonl", "a") as fh:
        fh.write('{"shard": "r000-0000')  # a torn line
    with pytest.raises(UserFacingError, match="still being written"):
        FeatureStore(store)
    manifest = _dump(job, store, shard_mib=0.05)
    assert manifest["state"] == "complete"
    assert _per_sample(store) == _per_sample(tmp_path / "whole")


def test_a_full_disk_is_one_line_and_the_rerun_completes(tmp_path, monkeypatch):
    import errno

    from dflash_train.features import writer

    job = _job(tmp_path, "job")
    _dump(job, tmp_path / "whole", shard_mib=0.05)
    calls, original = [], writer.atomic_write_bytes

    def fills_up(path, data, what, todo=""):
        calls.append(path)
        if len(calls) == 3:
            from dflash_train.files import file_error

            raise file_error(OSError(errno.ENOSPC, "No space left on device"), f"cannot write {what}", path, todo)
        return original(path, data, what, todo)

    monkeypatch.setattr(writer, "atomic_write_bytes", fills_up)
    with pytest.raises(UserFacingError) as caught:
        _dump(job, tmp_path / "store", shard_mib=0.05)
    assert "no space left on the device" in str(caught.value) and "\n" not in str(caught.value)
    monkeypatch.setattr(writer, "atomic_write_bytes", original)
    _dump(job, tmp_path / "store", shard_mib=0.05)
    assert _per_sample(tmp_path / "store") == _per_sample(tmp_path / "whole")


def test_a_disk_too_small_is_refused_before_the_dump_starts(tmp_path, monkeypatch):
    import shutil

    from dflash_train.features import writer

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda _p: usage._replace(free=1000))
    with pytest.raises(UserFacingError, match=r"needs 0\.\d+ GiB more, the disk has 0\.00 GiB free"):
        _dump(_job(tmp_path, "job"), tmp_path / "store")
    assert not list((tmp_path / "store").glob("*.safetensors"))


def _damage(store: Path, truncate: bool) -> Path:
    shard = sorted(store.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    if truncate:
        del data[-100:]
    else:
        data[-5] ^= 0x40  # a flipped bit in the last conversation's rows
    shard.write_bytes(bytes(data))
    return shard


@pytest.mark.parametrize("truncate", [False, True], ids=["flipped-bit", "truncated"])
def test_a_damaged_shard_names_itself_and_the_conversation(tmp_path, truncate):
    job = _job(tmp_path, "job")
    _dump(job, tmp_path / "whole")
    _dump(job, tmp_path / "store")
    shard = _damage(tmp_path / "store", truncate)
    stored = _from_store(_job(tmp_path, "stored", max_steps=40), tmp_path / "store")
    want = "has \\d+ bytes, its index says \\d+ \\(truncated" if truncate else "conversation \\d+ is damaged"
    with pytest.raises(UserFacingError, match=f"feature store shard {shard}.*{want}"):
        _train(stored)
    _dump(job, tmp_path / "store", verify=True)  # rewrites the damaged shard
    assert _per_sample(tmp_path / "store") == _per_sample(tmp_path / "whole")
    got, _ = _train(_from_store(_job(tmp_path, "again", max_steps=40), tmp_path / "store"))
    assert len(got) == 40


def test_two_writers_on_one_store_are_refused(tmp_path):
    from dflash_train.features.writer import StoreLock
    from dflash_train.run_lock import RunFolderBusy

    store = tmp_path / "store"
    store.mkdir()
    holder = StoreLock(store, echo=lambda *a: None, command="dflash-train features first")
    holder.acquire()
    try:
        with pytest.raises(RunFolderBusy, match="feature store .* is in use by another run .*features first.*or write another store$"):
            _dump(_job(tmp_path, "job"), store)
    finally:
        holder.release()


def test_a_rerun_with_another_encoding_is_refused(tmp_path):
    job = _job(tmp_path, "job")
    _dump(job, tmp_path / "store")
    with pytest.raises(UserFacingError, match="holds dtype=auto, this dump asks float8"):
        _dump(job, tmp_path / "store", "float8")
    assert _dump(job, tmp_path / "store")["state"] == "complete"  # the same job: complete already


def test_training_from_a_store_loads_only_the_targets_head(tmp_path, monkeypatch):
    """The path a job takes (target.path, no target passed in): embedding, final norm and lm_head load,
    no decoder layer; the drafter and the losses are those of online training."""
    from dflash_train.models.target import Target
    from dflash_train.train import trainer as trainer_module

    folder = tmp_path / "model"
    full = tiny_chat_target(SMOLLM2)
    full.model.save_pretrained(folder)
    full.tokenizer.save_pretrained(folder)
    head = Target.load_head(folder)
    assert len(head.layers) == 0 and head.num_layers == 6 and head.facts == full.facts
    assert fmt.head_fingerprint(head) == fmt.head_fingerprint(full)
    with pytest.raises(ValueError, match="loaded without its decoder layers"):
        head.features(torch.zeros(1, 4, dtype=torch.long), None, [1, 3])
    online = _job(tmp_path, "online", max_steps=4)
    online["target"]["path"] = str(folder)
    _dump(online, tmp_path / "store")
    want, _ = _train(online)
    loaded, original = [], trainer_module.load_target

    def recording(*args, **kwargs):
        loaded.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "load_target", recording)
    stored = _from_store(_job(tmp_path, "stored", max_steps=4), tmp_path / "store")
    stored["target"]["path"] = str(folder)
    summary = train(config_from_dict(stored), **QUIET)
    assert loaded == [{"layers": False}] and summary["steps"] == 4
    rows = [json.loads(line) for line in (tmp_path / "stored" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows if "loss" in r] == want


def test_the_options_a_store_cannot_serve_are_refused_in_one_line():
    from dflash_train.config import load_config

    store = ["train.feature_store=stores/x"]
    assert load_config("cpu-demo", [*store, "eval.prompts=null"]).train.feature_store == "stores/x"
    for extra, match in ((["eval.prompts=null", "train.feature_cache=cpu"], "has nothing to keep"),
                         ([], "eval.prompts decodes with the whole target"),
                         (["eval.prompts=null", "train.drafter_init=target"], "need them"),
                         (["eval.prompts=null", "train.fsdp_target=true"], "need them")):
        with pytest.raises(ValueError, match=match):
            load_config("cpu-demo", [*store, *extra])


def test_conversation_spans_match_a_token_by_token_reference():
    """Where each conversation's features sit in [rows * seq], packed or not, against a plain loop."""
    from dflash_train.data.batching import MicroBatch

    docs = torch.tensor([[4, 4, 4, 9, 9, -1], [7, 7, 2, -1, -1, -1], [5, 5, 5, 5, 5, 5]])
    mask = (docs >= 0).long()
    packed = MicroBatch(torch.zeros_like(docs), mask, mask, docs[:, 0], 0, docs)
    unpacked = MicroBatch(torch.zeros_like(docs), mask, mask, torch.tensor([4, 7, 5]), 0)
    for mb, flat in ((packed, docs.flatten().tolist()),
                     (unpacked, torch.where(mask.bool(), torch.tensor([[4], [7], [5]]), -1).flatten().tolist())):
        reference, previous = [], None
        for slot, sample in enumerate(flat):
            starts_row = slot % docs.shape[1] == 0
            if sample >= 0 and (sample != previous or starts_row):
                reference.append([sample, slot, 0])
            if sample >= 0:
                reference[-1][2] += 1
            previous = sample
        assert [list(s) for s in fmt.conversation_spans(mb)] == reference
