"""Nothing lost, nothing silently wrong (issue 19): run folders, checkpoint integrity,
non-finite steps, strict configs, metrics of resumed runs, what a stop says."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_train import job, losses, tiny_target

from dflash_train.config import config_from_dict, load_config
from dflash_train.run_folder import complete_checkpoints, latest_checkpoint
from dflash_train.train import trainer as trainer_mod
from dflash_train.train.curve import read_curve
from dflash_train.train.loop import train


def quiet(*args, **kwargs):
    pass


def run(cfg: dict, echo=quiet) -> dict:
    return train(config_from_dict(cfg), target=tiny_target(), echo=echo)


def names(run_dir: Path) -> list[str]:
    return [p.name for p in complete_checkpoints(run_dir)]


# -- 1. run folders and pruning -------------------------------------------------------------
def test_fresh_run_into_a_run_folder_with_checkpoints_is_refused(tmp_path):
    run(job(tmp_path, max_steps=4, save_every_steps=2))
    folder = tmp_path / "run"
    before = {p: p.read_bytes() for p in (folder / "metrics.jsonl", folder / "summary.json", folder / "config.json")}
    with pytest.raises(ValueError, match=r"already holds checkpoints.*train\.resume=auto.*new train\.run_dir"):
        run(job(tmp_path, max_steps=3))
    assert names(folder) == ["step-00000002", "step-00000004"]
    assert all(p.read_bytes() == data for p, data in before.items())  # nothing touched


def test_pruning_deletes_only_this_runs_history(tmp_path):
    """Resuming from an older checkpoint must not delete (or overwrite) the newer ones it did
    not write; keep_last prunes this run's own history only."""
    run(job(tmp_path, max_steps=6, save_every_steps=2, keep_last=2))
    folder = tmp_path / "run"
    assert names(folder) == ["step-00000004", "step-00000006"]
    old_six = (folder / "checkpoints" / "step-00000006" / "drafter.safetensors").read_bytes()
    older = str(folder / "checkpoints" / "step-00000004")
    run(job(tmp_path, max_steps=8, save_every_steps=2, keep_last=2, resume=older))
    assert names(folder) == ["step-00000006", "step-00000008"]  # 4 was this history's: pruned
    aside = [p for p in (folder / "checkpoints").iterdir() if ".superseded-" in p.name]
    assert len(aside) == 1 and aside[0].name.startswith("step-00000006")
    assert (aside[0] / "drafter.safetensors").read_bytes() == old_six
    summary = json.loads((folder / "summary.json").read_text())
    assert Path(summary["checkpoint"]).exists()


def test_pruning_keeps_the_checkpoint_summary_names(tmp_path):
    from dflash_train.train.checkpoint import CheckpointManager

    folder = tmp_path / "run"
    for step in (2, 4, 6, 8, 10):
        ckpt = folder / "checkpoints" / f"step-{step:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / "COMPLETE").write_text("")
    (folder / "summary.json").write_text(json.dumps({"checkpoint": str(folder / "checkpoints" / "step-00000004")}))
    manager = CheckpointManager(folder, model=None, optimizer=None, drafter=None, parts={}, config={},
                                drafter_config={}, step=lambda: 8, keep_last=1)
    manager.resumed_step, manager.written = 4, {"step-00000006", "step-00000008"}
    manager.prune()
    # 2 goes (this history, before the resume), 4 is summary.json's, 6 is superseded by 8,
    # 10 is newer than this run's step: not this run's to delete
    assert names(folder) == ["step-00000004", "step-00000008", "step-00000010"]


# -- 2. integrity: checksums, fallback, non-finite steps ------------------------------------
def _garble(shard: Path) -> None:
    """Garbage of the same size in the middle of a file (a size check cannot see it)."""
    data = bytearray(shard.read_bytes())
    middle, span = len(data) // 2, min(4096, len(data) // 4)
    data[middle - span:middle + span] = b"\xff" * (2 * span)
    shard.write_bytes(bytes(data))


def test_corrupt_newest_checkpoint_falls_back_and_says_so(tmp_path):
    run(job(tmp_path, max_steps=6, save_every_steps=2, keep_last=3))
    folder = tmp_path / "run"
    reference = losses(folder)
    newest = latest_checkpoint(folder)
    shard = next((newest / "state").glob("*.safetensors"))
    size = shard.stat().st_size
    _garble(shard)
    assert shard.stat().st_size == size
    said = []
    summary = run(job(tmp_path, max_steps=6, save_every_steps=2, keep_last=3, resume="auto"),
                  echo=lambda *a: said.append(" ".join(map(str, a))))
    text = "\n".join(said)
    assert f"checkpoint {newest} is corrupt" in text and "sha256" in text and "falling back" in text
    assert "step-00000004 at step 4" in text
    assert summary["steps"] == 6
    # resumed from step 4: the redone steps 5 and 6 give the same losses as before
    torch.testing.assert_close(torch.tensor(losses(folder)), torch.tensor(reference), rtol=1e-5, atol=1e-6)


def test_corrupt_explicit_resume_is_a_clear_error(tmp_path):
    run(job(tmp_path, max_steps=2))
    ckpt = latest_checkpoint(tmp_path / "run")
    _garble(next((ckpt / "state").glob("*.safetensors")))
    with pytest.raises(ValueError, match=r"step-00000002 is corrupt or incomplete: state/.*sha256"):
        run(job(tmp_path, max_steps=4, resume=str(ckpt)))


def _nan_at_step(monkeypatch, bad_step: int):
    """The target's features turn NaN for one step (a bad batch, an overflow)."""
    from dflash_train.train.features import LocalFeatures

    original = LocalFeatures.features
    calls = []  # one micro-batch per step in these jobs

    def features(self, micro_batch, input_ids, attention_mask):
        calls.append(1)
        out = original(self, micro_batch, input_ids, attention_mask)
        return out * math.nan if len(calls) == bad_step else out

    monkeypatch.setattr(LocalFeatures, "features", features)


def test_non_finite_step_stops_the_run_and_is_never_saved(tmp_path, monkeypatch):
    _nan_at_step(monkeypatch, 3)
    with pytest.raises(ValueError, match=r"non-finite loss or gradient norm at step 3 .*max_bad_steps=0"):
        run(job(tmp_path, max_steps=6, save_every_steps=1, keep_last=10))
    assert names(tmp_path / "run") == ["step-00000001", "step-00000002"]


def test_bad_steps_are_skipped_up_to_max_bad_steps(tmp_path, monkeypatch):
    _nan_at_step(monkeypatch, 3)
    seen = {}
    from dflash_train.train.step import TrainStep

    original_update = TrainStep._update

    def watched(self, step_loss, step_number):
        before = [p.detach().clone() for p in self.drafter.parameters()]
        out = original_update(self, step_loss, step_number)
        seen[int(step_number)] = all(torch.equal(a, p) for a, p in zip(before, self.drafter.parameters()))
        return out

    monkeypatch.setattr(TrainStep, "_update", watched)
    said = []
    summary = run(job(tmp_path, max_steps=5, max_bad_steps=1), echo=lambda *a: said.append(" ".join(map(str, a))))
    assert summary["steps"] == 5 and summary["bad_steps"] == 1
    assert seen == {1: False, 2: False, 3: True, 4: False, 5: False}  # step 3: no update at all
    assert any("skipped 1 step(s)" in line and "step 3" in line for line in said)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step3 = next(r for r in rows if r["step"] == 3)
    assert step3["bad_steps"] == 1 and math.isnan(step3["loss"])  # a window of only the bad step
    assert all(math.isfinite(r["loss"]) for r in rows if r["step"] != 3)
    state = json.loads((latest_checkpoint(tmp_path / "run") / "trainer_state.json").read_text())
    assert state["counters"]["bad_steps"] == 1


# -- 3. configs and inputs refused in one line ----------------------------------------------
@pytest.mark.parametrize("override, key", [
    ("train.save_every_steps=-2", "train.save_every_steps"),
    ("train.save_every_minutes=-1", "train.save_every_minutes"),
    ("eval.num_prompts=-1", "eval.num_prompts"),
    ("eval.max_new_tokens=0", "eval.max_new_tokens"),
    ("optim.betas=[2,3]", "optim.betas"),
    ("train.loggers=[jsonl,tensorbored]", "train.loggers"),
    ("train.wandb_mode=cloud", "train.wandb_mode"),
    ("train.device=gpu", "train.device"),
    ("train.max_bad_steps=-1", "train.max_bad_steps"),
    ("train.compile_mode=max-autotune", "train.compile_mode"),
    ("train.cuda_graphs=maybe", "train.cuda_graphs"),
    ("data.prefetch_steps=-1", "data.prefetch_steps"),
])
def test_bad_config_values_name_the_key(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_config("cpu-demo", [override])


def test_cli_errors_are_one_line(tmp_path, capsys):
    from dflash_train.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    assert main(["data", "inspect", "--data", str(data), "--tokenizer", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tokenizer" in err and "nope" in err
    assert main(["train", "cpu-demo", "train.device=gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.device" in err


def test_prompts_that_are_not_utf8_name_the_file(tmp_path):
    from dflash_train.data.prompts import read_prompts

    bad = tmp_path / "prompts.txt"
    bad.write_bytes(b"hello\nbad \xff\xfe bytes\n")
    with pytest.raises(ValueError, match=rf"{bad}:2: not UTF-8"):
        read_prompts(bad)
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a\x01"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:1: malformed JSON .*line 1 column"):
        read_prompts(jsonl)


def test_malformed_json_skip_message_keeps_the_position(tmp_path):
    from dflash_train.data.errors import DataError, SkipReport
    from dflash_train.data.readers import read_records

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a\x01", "response": "b"}\n')
    with pytest.raises(DataError, match=r"malformed_json: Invalid control character at: line 1 column \d+"):
        list(read_records([str(data)], SkipReport(), strict=True))


def test_missing_data_or_resume_path_is_reported_before_the_target_loads(tmp_path, monkeypatch):
    from dflash_train.models.target import Target

    def no_load(*a, **k):
        raise AssertionError("the target was loaded before the paths were checked")

    monkeypatch.setattr(Target, "load", staticmethod(no_load))
    cfg = job(tmp_path, max_steps=2)
    missing_data = {**cfg, "data": {**cfg["data"], "paths": [str(tmp_path / "missing.jsonl")]}}
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        train(config_from_dict(missing_data), echo=quiet)
    missing_resume = job(tmp_path, max_steps=2, resume=str(tmp_path / "no-such-checkpoint"))
    with pytest.raises(FileNotFoundError, match="no-such-checkpoint"):
        train(config_from_dict(missing_resume), echo=quiet)
    missing_prompts = {**cfg, "eval": {"prompts": str(tmp_path / "no-prompts.txt")}}
    with pytest.raises(FileNotFoundError, match="no-prompts.txt"):
        train(config_from_dict(missing_prompts), echo=quiet)
    (tmp_path / "a-file").write_text("")
    unwritable = job(tmp_path, max_steps=2, run_dir=str(tmp_path / "a-file" / "run"))
    with pytest.raises(ValueError, match=r"train\.run_dir .*a-file/run: cannot write there"):
        train(config_from_dict(unwritable), echo=quiet)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="train.device=cuda: CUDA is not available"):
            train(config_from_dict(job(tmp_path, max_steps=2, device="cuda")), echo=quiet)


def test_a_broken_config_file_is_one_line(tmp_path):
    broken = tmp_path / "job.yaml"
    broken.write_text("train: {max_steps: [1\n")
    with pytest.raises(ValueError, match=r"config .*job\.yaml: cannot read it: .*line 1"):
        load_config(str(broken))


# -- 4. a resumed run's metrics read as one run ---------------------------------------------
def test_resumed_run_metrics_read_as_one_run(tmp_path):
    run(job(tmp_path, max_steps=5, save_every_steps=3, keep_last=5))
    folder = tmp_path / "run"
    first_loss = losses(folder)[0]
    # a crash after step 5 was logged but before its checkpoint: only step 3 survives
    import shutil

    shutil.rmtree(folder / "checkpoints" / "step-00000005")
    summary = run(job(tmp_path, max_steps=6, save_every_steps=3, keep_last=5, resume="auto"))
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # steps 4 and 5 were redone: logged once
    assert summary["first_loss"] == first_loss
    curve = read_curve(folder)["loss"]
    assert [s for s, _ in curve] == sorted(s for s, _ in curve)  # no back-tracking line


# -- 6. what a stop says; export finds the target ------------------------------------------
def test_a_stop_says_where_the_checkpoint_is_and_how_to_resume(tmp_path, monkeypatch, capsys):
    from dflash_train.train.cli import run_train
    from dflash_train.train.loop import train as real_train

    original_run = trainer_mod.Trainer.run

    def stop_at_two(self, on_step_end=None):
        def hook(t):
            on_step_end(t)
            if t.counters.step == 2:
                t.stop_requested = t.signalled = True
        return original_run(self, hook)

    monkeypatch.setattr(trainer_mod.Trainer, "run", stop_at_two)
    config = tmp_path / "job.json"
    config.write_text(json.dumps(job(tmp_path, max_steps=6)))
    monkeypatch.setattr("dflash_train.train.loop.train", lambda cfg: real_train(cfg, target=tiny_target()))
    from types import SimpleNamespace

    args = SimpleNamespace(config=str(config), overrides=["train.log_every=1"], resume=None)
    assert run_train(args) == 0
    out = capsys.readouterr().out
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000002"
    assert f"stopped at step 2 of 6: checkpoint {ckpt}" in out
    assert f"resume with: dflash-train train {config} train.log_every=1 train.resume=auto" in out


def test_export_takes_the_target_from_the_run_config(tmp_path, capsys):
    from dflash_train.cli import main

    target = tiny_target()
    folder = tmp_path / "target"  # the tiny target as a model folder (config + tokenizer)
    target.model.config.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    cfg = job(tmp_path, max_steps=1)
    cfg["target"]["path"] = str(folder)
    train(config_from_dict(cfg), target=target, echo=quiet)
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "run"), str(out)]) == 0
    printed = capsys.readouterr().out
    assert '"tokenizer": true' in printed and (out / "tokenizer_config.json").exists()


def test_disk_full_during_a_save_stops_the_run_in_one_line(tmp_path, monkeypatch):
    """ENOSPC out of DCP's writer (wrapped in a ``CheckpointException``, as DCP does) during the
    second save: one line naming the checkpoint and how to continue, the partial ``step-N.tmp``
    removed, the earlier checkpoint intact; a resume then finishes the run."""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    from dflash_train.train import checkpoint as checkpoint_mod

    real_save, calls = checkpoint_mod.dcp.save, []

    def full_on_the_second(state, storage_writer=None, process_group=None):
        calls.append(1)
        if len(calls) < 2:
            return real_save(state, storage_writer=storage_writer, process_group=process_group)
        partial = next((tmp_path / "run" / "checkpoints").glob("*.tmp")) / "state"
        partial.mkdir()
        (partial / "model-00001.safetensors").write_bytes(b"x" * 1000)  # half written when the disk filled
        err = OSError(errno.ENOSPC, "No space left on device")
        raise CheckpointException("failed", {0: _wrap_exception(err)})

    monkeypatch.setattr(checkpoint_mod.dcp, "save", full_on_the_second)
    folder = tmp_path / "run"
    with pytest.raises(ValueError) as caught:
        run(job(tmp_path, max_steps=4, save_every_steps=2))
    text = str(caught.value)
    assert "\n" not in text and "[Errno" not in text, text
    assert f"cannot save checkpoint {folder / 'checkpoints' / 'step-00000004'}: no space left" in text
    assert "train.resume=auto" in text
    assert names(folder) == ["step-00000002"]
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]
    monkeypatch.undo()
    run(job(tmp_path, max_steps=4, save_every_steps=2, resume="auto"))
    assert names(folder) == ["step-00000002", "step-00000004"]
