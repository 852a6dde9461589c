"""``dflash-train export RUN_OR_CHECKPOINT OUT`` over fake training artifacts."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dflash_train.cli import main
from dflash_train.export.cli import find_checkpoint, read_training_artifact
from dflash_train.export.serving import load_drafter_folder
from dflash_train.models.target import Target
from dflash_train.run_folder import CHECKSUMS, file_checksums

_spec = importlib.util.spec_from_file_location("_dflash_root_conftest_cli", Path(__file__).parents[1] / "conftest.py")
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
tiny_qwen3, tiny_drafter = _root.tiny_qwen3, _root.tiny_drafter
REPO = Path(__file__).resolve().parents[2]


def write_checkpoint(folder: Path, seed: int, complete: bool = True, prefix: str = "", target: str | None = None):
    target_model = Target(tiny_qwen3())
    drafter, cfg = tiny_drafter(target_model, seed=seed)
    folder.mkdir(parents=True)
    (folder / "drafter_config.json").write_text(json.dumps(cfg.to_dict()))
    save_file({prefix + k: v.contiguous() for k, v in drafter.state_dict().items()}, str(folder / "drafter.safetensors"))
    if target is not None:  # the job config the trainer saves next to the drafter
        (folder / "config.json").write_text(json.dumps({"target": {"path": target}}))
    (folder / CHECKSUMS).write_text(json.dumps(file_checksums(folder)))  # as the trainer writes them
    if complete:
        (folder / "COMPLETE").write_text("")
    return drafter, cfg


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    drafters = {}
    for step, complete in ((100, True), (2000, True), (3000, False)):
        drafters[step], _ = write_checkpoint(run / "checkpoints" / f"step-{step:06d}", seed=step, complete=complete)
    return run, drafters


def test_picks_newest_complete_checkpoint(run_dir):
    run, drafters = run_dir
    assert find_checkpoint(run).name == "step-002000"  # step-003000 has no COMPLETE marker
    cfg, state, target = read_training_artifact(run)
    assert target is None and cfg.block_size == 4
    assert torch.equal(state["fc.weight"], drafters[2000].fc.weight)


def test_cli_export_run_folder(run_dir, tmp_path, capsys):
    run, drafters = run_dir
    out = tmp_path / "out"
    assert main(["export", str(run), str(out), "--dtype", "float32"]) == 0
    assert "step-002000" in capsys.readouterr().out
    loaded, cfg = load_drafter_folder(out)
    assert torch.equal(loaded.fc.weight, drafters[2000].fc.weight)
    for k, v in drafters[2000].state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]

    # an existing OUT is refused without --force, and left untouched
    before = (out / "model.safetensors").read_bytes()
    assert main(["export", str(run / "checkpoints" / "step-000100"), str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == before
    assert main(["export", str(run / "checkpoints" / "step-000100"), str(out), "--force", "--dtype", "bfloat16"]) == 0
    loaded, _ = load_drafter_folder(out)
    assert torch.equal(loaded.fc.weight, drafters[100].fc.weight.to(torch.bfloat16).float())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_complete_checkpoint_without_weights_is_skipped(run_dir):
    """A COMPLETE folder that lacks the drafter weights is passed over for an older usable one."""
    run, _ = run_dir
    newest = run / "checkpoints" / "step-004000"
    newest.mkdir()
    (newest / "COMPLETE").write_text("")
    assert find_checkpoint(run).name == "step-002000"


def _flip_a_byte(path: Path) -> None:
    """Same size, other bytes: only the checksum can tell."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_checkpoint_is_never_exported(run_dir):
    """A run's newest complete checkpoint whose weights changed after the save is passed over
    (with a warning) for the previous one; named explicitly, it is refused; a run with no
    checkpoint that verifies is refused."""
    run, _ = run_dir
    newest, older = run / "checkpoints" / "step-002000", run / "checkpoints" / "step-000100"
    _flip_a_byte(newest / "drafter.safetensors")
    with pytest.warns(UserWarning, match="step-002000 is corrupt"):
        assert find_checkpoint(run) == older
    with pytest.raises(ValueError, match="is corrupt: drafter.safetensors does not match its sha256"):
        find_checkpoint(newest)
    _flip_a_byte(older / "drafter.safetensors")
    with pytest.raises(ValueError, match="none of its 2 complete checkpoint"), pytest.warns(UserWarning):
        find_checkpoint(run)


@pytest.mark.parametrize("flag, dtype", [(None, torch.bfloat16), ("bfloat16", torch.bfloat16),
                                         ("float16", torch.float16), ("float32", torch.float32)])
def test_cli_export_dtype(tmp_path, flag, dtype):
    """bf16 unless --dtype says otherwise (the authors ship bf16); every saved tensor has that dtype."""
    from safetensors import safe_open

    drafter, _ = write_checkpoint(tmp_path / "ck", seed=2)  # a float32 checkpoint
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "ck"), str(out), *(["--dtype", flag] if flag else [])]) == 0
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118
    assert dtypes == {dtype}
    name = str(dtype).removeprefix("torch.")
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == name
    loaded, _ = load_drafter_folder(out)  # read back as float32, values rounded once
    assert torch.equal(loaded.fc.weight, drafter.fc.weight.to(dtype).float())


def test_cli_refuses_folder_that_is_neither(tmp_path, capsys):
    empty = tmp_path / "nothing"
    write_checkpoint(empty / "checkpoints" / "step-5", seed=1, complete=False)
    with pytest.raises(ValueError, match="neither a checkpoint folder .* nor a run folder.*1 checkpoint"):
        read_training_artifact(empty)
    assert main(["export", str(empty), str(tmp_path / "out")]) == 2
    assert "neither a checkpoint folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError):
        read_training_artifact(tmp_path / "missing")


def test_checkpoint_prefixes_stripped_and_bad_files(tmp_path):
    drafter, _ = write_checkpoint(tmp_path / "ck", seed=3, prefix="_orig_mod.")
    _, state, _ = read_training_artifact(tmp_path / "ck")
    assert torch.equal(state["fc.weight"], drafter.fc.weight)
    (tmp_path / "ck" / CHECKSUMS).unlink()  # a checkpoint from before checksums: the files speak for themselves
    (tmp_path / "ck" / "drafter.safetensors").write_bytes(b"\x01" * 40)
    with pytest.raises(ValueError, match=r"drafter\.safetensors: not a readable safetensors file"):
        read_training_artifact(tmp_path / "ck")
    (tmp_path / "ck" / "drafter_config.json").write_text(json.dumps({"block_size": 4, "bogus": 1}))
    with pytest.raises(ValueError, match=r"drafter_config\.json: unknown drafter config key\(s\) \['bogus'\]"):
        read_training_artifact(tmp_path / "ck")


def test_cli_target_check_and_tokenizer(tmp_path, capsys):
    good = tmp_path / "target"
    tiny_qwen3().save_pretrained(good)
    smollm2 = _root.SMOLLM2
    has_tok = (smollm2 / "tokenizer.json").exists()
    if has_tok:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(smollm2 / name, good / name)
    write_checkpoint(tmp_path / "ck", seed=1, target=str(good))
    args = ["export", str(tmp_path / "ck"), str(tmp_path / "out")]
    assert main(args if has_tok else [*args, "--no-tokenizer"]) == 0
    assert (tmp_path / "out" / "tokenizer.json").exists() == has_tok
    assert main([*args[:2], str(tmp_path / "out2"), "--no-tokenizer"]) == 0
    assert not (tmp_path / "out2" / "tokenizer.json").exists()

    wrong = tmp_path / "wrong"
    tiny_qwen3(hidden=32).save_pretrained(wrong)
    capsys.readouterr()
    assert main([*args[:2], str(tmp_path / "out3"), "--target", str(wrong), "--no-tokenizer"]) == 2
    assert "hidden_size 64 != the target's hidden size 32" in capsys.readouterr().err
    assert not (tmp_path / "out3").exists()


def test_ruff_clean_on_export_paths():
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff not installed in this environment")
    paths = [str(REPO / "src" / "dflash_train" / "export"), str(REPO / "tests" / "export")]
    result = subprocess.run([str(ruff), "check", "--line-length", "110", *paths], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
