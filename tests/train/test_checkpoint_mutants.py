"""What ``train/checkpoint.py`` must do, pinned where mutation testing found it unchecked (issue 60.4).

mutmut over ``checkpoint.py``, against ``test_checkpoint_manager.py`` and the run-folder tests, left
alive: the optimizer's hyperparameters restored with their types (a list where a tuple was: an optimizer
state that differs from the uninterrupted run's), every branch of ``resolve_resume`` with an explicit
path, a save failure wrapped by DCP, the reader's failure named by its last line, and the one-line
refusals. Each check is against what was saved, or the line a user must see. The equivalent survivors,
and why: ``docs/results/mutation/checkpoint-triage.md``.
"""

from __future__ import annotations

import errno
import re
import traceback

import pytest
import torch
from test_checkpoint_manager import _advance, _toy
from torch.distributed.checkpoint.api import CheckpointException

import dflash_train.train.checkpoint as ckpt
from dflash_train.files import UserFacingError, describe_os_error, seal_json
from dflash_train.train.checkpoint import (
    SAVE_TODO,
    CheckpointManager,
    check_run_folder,
    config_differences,
    resolve_resume,
    summary_checkpoint,
)


def _saved_run(tmp_path, saves: int = 2):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    paths = []
    for _ in range(saves):
        _advance(model, optimizer, position, clock, 2)
        paths.append(manager.save())
    return manager, model, optimizer, paths


def test_load_restores_the_optimizers_hyperparameters_with_their_types(tmp_path):
    """lr, betas (a tuple, as the optimizer was built with), weight decay, eps: the loaded optimizer's
    ``state_dict()`` equals the saved one's, types included, and the next step is the same step."""
    manager, model, optimizer, paths = _saved_run(tmp_path, saves=1)
    for group in optimizer.param_groups:
        group.update(lr=0.03, betas=(0.8, 0.9), weight_decay=0.25, eps=1e-6)
    path = manager.save()
    want = optimizer.state_dict()
    other, model2, optimizer2, position2, clock2 = _toy(tmp_path, seed=3)
    _advance(model2, optimizer2, position2, clock2, 1)
    other.load(path)
    got = optimizer2.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert type(got["param_groups"][0]["betas"]) is tuple
    for index, state in want["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(got["state"][index][name], value, rtol=0, atol=0)
    x = torch.randn(2, 4)
    for m, opt in ((model, optimizer), (model2, optimizer2)):
        m(x).square().sum().backward()
        opt.step()
    torch.testing.assert_close(model2.weight, model.weight, rtol=0, atol=0)


def test_resolve_resume_with_an_explicit_path(tmp_path):
    manager, model, optimizer, paths = _saved_run(tmp_path)
    assert resolve_resume(None, tmp_path) is None and resolve_resume("", tmp_path) is None
    assert resolve_resume(str(paths[0]), tmp_path) == paths[0]
    assert resolve_resume(str(tmp_path), tmp_path) == paths[-1]  # a run folder: its newest
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        resolve_resume(str(missing), tmp_path)
    assert str(err.value) == f"train.resume: checkpoint not found: {missing}"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError) as err:
        resolve_resume(str(empty), tmp_path)
    assert str(err.value) == f"{empty} is not a complete checkpoint (no COMPLETE marker) and holds none"
    (paths[-1] / "drafter.safetensors").write_bytes(b"rot")
    with pytest.raises(ValueError) as err:
        resolve_resume(str(paths[-1]), tmp_path)
    assert str(err.value).startswith(f"checkpoint {paths[-1]} is corrupt or incomplete: ")
    assert str(err.value).endswith("; resume from an older one (train.resume=<its folder>) or with train.resume=auto "
                                   "(the newest that verifies)")
    with pytest.raises(ValueError, match=r"^checkpoint .* is corrupt"):
        resolve_resume(str(tmp_path), tmp_path)  # its newest does not verify: an explicit path must


def test_resolve_resume_auto_names_itself_when_every_checkpoint_is_corrupt(tmp_path):
    manager, model, optimizer, paths = _saved_run(tmp_path)
    for path in paths:
        (path / "drafter.safetensors").write_bytes(b"rot")
    with pytest.raises(ValueError) as err:
        resolve_resume("auto", tmp_path, echo=lambda line: None)
    assert str(err.value).startswith("train.resume=auto: ")


def test_a_fresh_run_into_a_folder_with_checkpoints_is_refused_in_one_line(tmp_path):
    manager, model, optimizer, paths = _saved_run(tmp_path)
    with pytest.raises(ValueError) as err:
        check_run_folder(tmp_path, None)
    assert str(err.value) == (f"{tmp_path} already holds checkpoints (2 under checkpoints/): continue it with "
                              "train.resume=auto, or start over with a new train.run_dir")
    check_run_folder(tmp_path, "auto")
    check_run_folder(tmp_path / "new", None)


def _dcp_failure(*errors: BaseException) -> CheckpointException:
    return CheckpointException("save failed", {rank: (e, traceback.StackSummary()) for rank, e in enumerate(errors)})


def test_a_save_failure_inside_dcp_is_named_by_its_os_error(tmp_path):
    final = tmp_path / "checkpoints" / "step-00000002"
    full = OSError(errno.ENOSPC, "No space left on device")
    want = describe_os_error(full, "cannot save checkpoint", final, SAVE_TODO)
    for err in (_dcp_failure(RuntimeError("other rank"), full), full):
        line = ckpt._save_failure(err, final)
        assert isinstance(line, UserFacingError) and str(line) == want
    assert str(final) in want and SAVE_TODO in want
    assert ckpt._save_failure(_dcp_failure(RuntimeError("not a file")), final) is None
    assert ckpt._save_failure(ValueError("a bug"), final) is None


def test_a_save_that_fails_in_dcp_leaves_no_tmp_folder_and_says_one_line(tmp_path, monkeypatch):
    manager, model, optimizer, paths = _saved_run(tmp_path, saves=1)

    def full_disk(*args, **kwargs):
        raise _dcp_failure(OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(ckpt.dcp, "save", full_disk)
    with pytest.raises(UserFacingError, match="cannot save checkpoint") as err:
        manager.save()
    assert "step-00000002" in str(err.value) and "\n" not in str(err.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [paths[0].name]


@pytest.mark.parametrize(("message", "reason"), [("DCP failed\n\n  the last line  \n\n", "the last line"),
                                                 ("only line", "only line"), ("", "RuntimeError")])
def test_a_reader_failure_is_named_by_its_last_line(tmp_path, monkeypatch, message, reason):
    manager, model, optimizer, paths = _saved_run(tmp_path, saves=1)

    def broken(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(ckpt.dcp, "load", broken)
    with pytest.raises(ValueError) as err:
        manager.load(paths[0])
    assert str(err.value) == f"checkpoint {paths[0] / 'state'} is corrupt or incomplete: {reason}"


def test_checkpoint_json_missing_dangling_or_corrupt_is_one_line(tmp_path):
    missing = tmp_path / "config.json"
    with pytest.raises(UserFacingError) as err:
        ckpt._read_json(missing)
    assert str(err.value) == f"checkpoint file missing: {missing}"
    dangling = tmp_path / "link.json"
    dangling.symlink_to(tmp_path / "gone.json")
    with pytest.raises(UserFacingError) as err:
        ckpt._read_json(dangling)
    assert str(err.value).startswith("cannot read checkpoint file") and str(dangling) in str(err.value)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(UserFacingError) as err:
        ckpt._read_mapping(listing)
    assert str(err.value) == f"checkpoint file corrupt: {listing} (a JSON object expected, found list)"


def test_config_differences_skip_what_may_change_and_fill_added_keys():
    saved = {"train": {"seed": 0, "max_steps": 5, "loggers": ["jsonl"]}, "data": {"max_len": 64}, "eval": {"x": 1},
             "drafter": {"betas": (0.9, 0.95)}}
    now = {"train": {"seed": 0, "max_steps": 9, "loggers": ["tensorboard"]}, "data": {"max_len": 64, "trim_loops": False},
           "eval": {"x": 2}, "drafter": {"betas": [0.9, 0.95]}}
    assert config_differences(saved, now) == []
    now["data"]["trim_loops"] = True
    now["train"]["seed"] = 1
    assert config_differences(saved, now) == ["data.trim_loops: checkpoint False vs now True",
                                              "train.seed: checkpoint 0 vs now 1"]
    assert config_differences({"block_size": 8}, {"block_size": 16}, "drafter(resolved).") == [
        "drafter(resolved).block_size: checkpoint 8 vs now 16"]


def test_summary_checkpoint_is_the_named_folder_only_when_its_seal_holds(tmp_path):
    folder = tmp_path / "checkpoints" / "step-00000004"
    folder.mkdir(parents=True)
    summary = tmp_path / "summary.json"
    assert summary_checkpoint(tmp_path) is None
    summary.write_text(seal_json({"checkpoint": str(folder)}))
    assert summary_checkpoint(tmp_path) == folder.resolve()
    summary.write_text(seal_json({"checkpoint": 4}))
    assert summary_checkpoint(tmp_path) is None
    summary.write_text(seal_json({"checkpoint": str(folder)}).replace("step-00000004", "step-00000002"))
    assert summary_checkpoint(tmp_path) is None  # the seal no longer matches: protects nothing


def test_pruning_keeps_the_checkpoint_the_summary_names(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=1)
    _advance(model, optimizer, position, clock, 1)
    first = manager.save()
    (tmp_path / "summary.json").write_text(seal_json({"checkpoint": str(first)}))
    for _ in range(2):
        _advance(model, optimizer, position, clock, 1)
        manager.save()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001", "step-00000003"]


def test_a_checkpoint_of_another_history_is_kept_aside_not_replaced(tmp_path):
    """A resume from step 2 that saves step 4 again, where another history's step 4 stands: kept under
    ``.superseded-...`` (and said); this run's own step N is replaced in place."""
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    for _ in range(2):
        _advance(model, optimizer, position, clock, 2)
        manager.save()
    said = []
    other = CheckpointManager(tmp_path, model=model, optimizer=optimizer, drafter=model, parts={"position": position},
                              config={"train": {"seed": 0}}, drafter_config={"block_size": 4},
                              step=lambda: clock["step"], keep_last=5, echo=said.append)
    clock["step"] = 2
    other.load(tmp_path / "checkpoints" / "step-00000002")
    clock["step"] = 4
    other.save()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names[:2] == ["step-00000002", "step-00000004"]
    assert re.fullmatch(r"step-00000004\.superseded-\d{8}-\d{6}", names[2])
    assert len(names) == 3 and said == [f"checkpoint {tmp_path / 'checkpoints' / 'step-00000004'} was not written "
                                        f"by this run: moved to {names[2]}"]
    other.save()  # its own step 4 now: replaced, nothing more kept aside
    assert len(list((tmp_path / "checkpoints").iterdir())) == 3


def test_config_differences_name_a_section_that_became_a_value_and_keep_every_difference():
    assert config_differences({"a": {"x": 1}, "b": 1}, {"a": 5, "b": 2}) == ["a: checkpoint {'x': 1} vs now 5",
                                                                          "b: checkpoint 1 vs now 2"]


def test_checkpoint_json_corrupt_or_nested_too_deeply_is_one_line(tmp_path):
    corrupt = tmp_path / "optim_groups.json"
    corrupt.write_text("{not json")
    with pytest.raises(UserFacingError) as err:
        ckpt._read_json(corrupt)
    assert str(err.value).startswith(f"checkpoint file corrupt: {corrupt} (Expecting property name")
    corrupt.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserFacingError) as err:
        ckpt._read_json(corrupt)
    assert str(err.value) == f"checkpoint file corrupt: {corrupt} (nested too deeply)"


def test_a_summary_whose_seal_broke_protects_nothing_and_says_so(tmp_path, capsys):
    folder = tmp_path / "checkpoints" / "step-00000004"
    (tmp_path / "summary.json").write_text(seal_json({"checkpoint": str(folder)}).replace("0000004", "0000002"))
    assert summary_checkpoint(tmp_path) is None
    said = capsys.readouterr().err
    assert f"run summary {tmp_path / 'summary.json'} " in said
    assert said.rstrip().endswith("; no checkpoint is kept for its sake")


def test_a_save_passes_its_fault_points_in_order_inside_step_n_tmp(tmp_path, monkeypatch):
    """The kill soak aims at these points by name; at the first the shards are in ``step-N.tmp``, the
    folder the run lock sweeps after a killed save; a replaced step N passes ``checkpoint-replace``."""
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    _advance(model, optimizer, position, clock, 2)
    seen = []
    monkeypatch.setattr(ckpt, "reached", lambda name: seen.append(
        (name, sorted(p.name for p in (tmp_path / "checkpoints").iterdir()))))
    manager.save()
    assert seen == [("checkpoint-shards", ["step-00000002.tmp"]), ("checkpoint-complete", ["step-00000002.tmp"])]
    seen.clear()
    manager.save()  # its own step 2 again: replaced
    assert [name for name, _ in seen] == ["checkpoint-shards", "checkpoint-complete", "checkpoint-replace"]
    assert seen[-1][1] == ["step-00000002.old", "step-00000002.tmp"]


def test_a_stale_tmp_folder_and_a_stale_set_aside_do_not_leak_into_a_save(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    _advance(model, optimizer, position, clock, 2)
    stale = tmp_path / "checkpoints" / "step-00000002.tmp"
    stale.mkdir(parents=True)
    (stale / "junk.bin").write_bytes(b"from a killed save")
    path = manager.save()
    assert not (path / "junk.bin").exists()
    (tmp_path / "checkpoints" / "step-00000002.old").mkdir()
    (tmp_path / "checkpoints" / "step-00000002.old" / "junk.bin").write_bytes(b"a killed replace")
    manager.save()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002"]


def test_a_failed_rename_puts_the_replaced_step_back(tmp_path, monkeypatch):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    _advance(model, optimizer, position, clock, 2)
    path = manager.save()
    position.value = 999
    real = type(path).rename

    def failing(self, target):
        if self.name.endswith(".tmp"):
            raise OSError(errno.EIO, "Input/output error")
        return real(self, target)

    monkeypatch.setattr(type(path), "rename", failing)
    with pytest.raises(UserFacingError, match="cannot save checkpoint"):
        manager.save()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002"]
    assert '"value": 14' in (path / "trainer_state.json").read_text()


def test_a_failure_that_is_not_the_file_systems_is_raised_as_it_is(tmp_path, monkeypatch):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    _advance(model, optimizer, position, clock, 2)

    def bug(*args, **kwargs):
        raise RuntimeError("a bug, not a full disk")

    monkeypatch.setattr(ckpt.dcp, "save", bug)
    with pytest.raises(RuntimeError, match="a bug, not a full disk"):
        manager.save()
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_load_names_a_missing_part_a_part_that_does_not_fit_and_every_drafter_difference(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    _advance(model, optimizer, position, clock, 2)
    path = manager.save()
    manager.parts["scheduler"] = position
    with pytest.raises(ValueError) as err:
        manager.load(path)
    assert str(err.value) == f"checkpoint {path / 'trainer_state.json'} lacks ['scheduler']"
    del manager.parts["scheduler"]
    (path / "trainer_state.json").write_text('{"position": {"other": 1}}')
    with pytest.raises(UserFacingError) as err:
        manager.load(path)
    assert str(err.value) == (f"checkpoint file corrupt: {path / 'trainer_state.json'}: entry 'position' does not fit "
                              "(KeyError: 'value'); resume from another checkpoint")
    manager.drafter_config = {"block_size": 8}
    manager.config = {"train": {"seed": 2}}
    with pytest.raises(ValueError) as err:
        manager.load(path)
    assert str(err.value) == (f"cannot resume from {path}: the config differs:\n  train.seed: checkpoint 0 vs now 2"
                              "\n  drafter(resolved).block_size: checkpoint 4 vs now 8")


def test_pruning_after_a_resume_takes_only_this_runs_history(tmp_path):
    """History A saved steps 1-4. Run B resumes from step 2 (keep_last=1) and saves step 4: A's step 4 is
    kept aside; steps 1 and 2 (at or before B's resume) are B's history and pruned; A's step 3 is not."""
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    for _ in range(4):
        _advance(model, optimizer, position, clock, 1)
        manager.save()
    other = CheckpointManager(tmp_path, model=model, optimizer=optimizer, drafter=model, parts={"position": position},
                              config={"train": {"seed": 0}}, drafter_config={"block_size": 4},
                              step=lambda: clock["step"], keep_last=1, echo=lambda line: None)
    clock["step"] = 2
    other.load(tmp_path / "checkpoints" / "step-00000002")
    clock["step"] = 4
    other.save()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names[:2] == ["step-00000003", "step-00000004"] and names[2].startswith("step-00000004.superseded-")


def test_a_fresh_manager_prunes_none_of_the_checkpoints_it_did_not_write(tmp_path):
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=5)
    for _ in range(2):
        _advance(model, optimizer, position, clock, 1)
        manager.save()
    fresh, model2, optimizer2, position2, clock2 = _toy(tmp_path, keep_last=1)
    clock2["step"] = 3
    fresh.save()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000001", "step-00000002", "step-00000003"]


def test_a_checkpoint_that_will_not_delete_stops_neither_a_prune_nor_a_failed_saves_line(tmp_path, monkeypatch):
    """Removing an old checkpoint or a failed save's ``.tmp`` is cleanup: a removal that fails (a file
    vanished, a busy mount) is ignored, so the run goes on or the save's own one line is what is said."""
    manager, model, optimizer, position, clock = _toy(tmp_path, keep_last=1)
    real = ckpt.shutil.rmtree

    def stubborn(path, ignore_errors=False, **kwargs):
        if not ignore_errors:
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        return real(path, ignore_errors=True, **kwargs)

    monkeypatch.setattr(ckpt.shutil, "rmtree", stubborn)
    for _ in range(2):
        _advance(model, optimizer, position, clock, 1)
        manager.save()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002"]

    def full_disk(*args, **kwargs):
        raise _dcp_failure(OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(ckpt.dcp, "save", full_disk)
    _advance(model, optimizer, position, clock, 1)
    with pytest.raises(UserFacingError, match="cannot save checkpoint"):
        manager.save()
