"""Issue 60 item 1: every file the project writes and reads back is verified on read.

Each test damages bytes so that the file *still parses* (a digit changed, a token id changed, a
byte of a weight flipped): only the check added for that file can see it. Next to each, the
happy path and a file written before the check existed (it still loads). docs/faults.md rows
60.4-60.14 name these tests.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from dflash_train import files
from dflash_train.files import SEAL, UNSEALED, UserFacingError, seal_json, unseal_json, write_sidecar


def _change(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` after the checksum field: the text still parses."""
    text = path.read_text()
    head = text.index(SEAL) + len(SEAL) + 80 if SEAL in text else 0  # past the checksum's own value
    assert text.count(old, head) == 1, (old, text)
    at = text.index(old, head)
    path.write_text(text[:at] + new + text[at + len(old):])
    assert isinstance(json.loads(path.read_text()), dict)  # still parses


def target_gguf(path: Path, vocab: int) -> Path:
    """A vocabulary-only GGUF standing in for the target's (what our writer reads of it)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(vocab)])
    writer.add_array("tokenizer.ggml.token_type", [1] * vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- files.seal_json: the checksum inside a JSON object --------------------------------------------
def test_a_sealed_json_text_catches_a_changed_digit_and_older_texts_still_load():
    text = seal_json({"loss": 0.25, "step": 3}, indent=1)
    assert unseal_json(text) == ({"loss": 0.25, "step": 3}, None)
    damaged = text.replace("0.25", "0.75")
    assert json.loads(damaged)["loss"] == 0.75  # still parses
    obj, problem = unseal_json(damaged)
    assert obj is None and "does not match its checksum" in problem
    assert unseal_json(json.dumps({"step": 3})) == ({"step": 3}, UNSEALED)
    assert unseal_json(text.replace('"_sha256": "', '"_sha256": "x'))[1] == "its checksum field _sha256 is damaged"
    short = seal_json({"step": 1, "loss": float("nan")}, digits=12)  # a metrics line: NaN, 12 hex digits
    assert unseal_json(short)[1] is None and len(json.loads(short)[SEAL]) == 12
    resealed = seal_json({**json.loads(text), "step": 4})  # an object read back and rewritten: one checksum
    assert resealed.count(SEAL) == 1 and unseal_json(resealed) == ({"loss": 0.25, "step": 4}, None)


# -- 60.4 metrics.jsonl ----------------------------------------------------------------------------
def _metrics_run(tmp_path) -> tuple[Path, object]:
    from dflash_train.tracking.jsonl import JsonlSink

    sink = JsonlSink(types.SimpleNamespace(run_dir=tmp_path))
    for step, loss in ((1, 2.5), (2, 1.5), (3, 0.5)):
        sink.log(step, {"loss": loss, "expected_acceptance": 1.0 + step / 10})
    return tmp_path / "metrics.jsonl", sink


def test_a_metrics_line_changed_after_it_was_appended_is_dropped_and_counted(tmp_path, capsys):
    from dflash_train.tracking.jsonl import read_metrics
    from dflash_train.train.curve import read_curve

    path, sink = _metrics_run(tmp_path)
    assert [r["loss"] for r in read_metrics(tmp_path)] == [2.5, 1.5, 0.5]  # the happy path
    assert all(SEAL not in r for r in read_metrics(tmp_path))
    assert capsys.readouterr().err == ""
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"loss": 1.5', '"loss": 1.0')  # still JSON, still a number
    path.write_text("\n".join(lines) + "\n")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 3]
    err = capsys.readouterr().err
    assert "metrics.jsonl: 1 line(s) dropped: their checksum does not match" in err and "line 2" in err
    assert [step for step, _ in read_curve(tmp_path)["loss"]] == [1, 3]  # dflash-train curve too
    assert "1 line(s) dropped" in capsys.readouterr().err
    sink.rewind(10)  # the resume's rewind: the damaged line is not carried on
    assert len(path.read_text().splitlines()) == 2 and "1 line(s) dropped" in capsys.readouterr().err


def test_metrics_lines_without_a_checksum_still_load_with_one_note(tmp_path, capsys):
    from dflash_train.tracking.jsonl import read_metrics

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2)))
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert "2 line(s) carry no checksum (written by an older version)" in capsys.readouterr().err


# -- 60.5 RUN/config.json ----------------------------------------------------------------------------
def test_a_run_config_changed_after_it_was_written_names_no_target(tmp_path, capsys):
    from dflash_train.export.cli import _trained_target
    from dflash_train.train.loop import write_run_config

    (tmp_path / "target-1").mkdir()
    (tmp_path / "target-7").mkdir()  # a damaged digit could name another model that exists
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    ckpt.mkdir()  # a checkpoint without its own config.json: the run's is read
    trainer = types.SimpleNamespace(ranks=types.SimpleNamespace(is_main=True), run_dir=run,
                                    cfg=types.SimpleNamespace(to_dict=lambda: {"target": {"path": str(tmp_path / "target-1")}}),
                                    drafter_cfg=types.SimpleNamespace(to_dict=dict))
    write_run_config(trainer)
    assert _trained_target(ckpt, run) == str(tmp_path / "target-1")
    _change(run / "config.json", "target-1", "target-7")
    assert _trained_target(ckpt, run) is None
    assert "run config" in capsys.readouterr().err
    (run / "config.json").write_text(json.dumps({"target": {"path": str(tmp_path / "target-1")}}))  # older
    assert _trained_target(ckpt, run) == str(tmp_path / "target-1")


# -- 60.6 RUN/summary.json -----------------------------------------------------------------------------
def test_a_summary_changed_after_it_was_written_protects_no_checkpoint(tmp_path, capsys):
    from dflash_train.train.checkpoint import summary_checkpoint
    from dflash_train.train.loop import write_summary

    named = tmp_path / "checkpoints" / "step-00000002"
    write_summary(tmp_path, {"steps": 2, "checkpoint": str(named)})
    assert summary_checkpoint(tmp_path) == named.resolve()
    _change(tmp_path / "summary.json", "step-00000002", "step-00000003")
    assert summary_checkpoint(tmp_path) is None
    assert "summary.json does not match its checksum" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text(json.dumps({"checkpoint": str(named)}))  # an older version's
    assert summary_checkpoint(tmp_path) == named.resolve()


# -- 60.7 RUN/tracking.json ---------------------------------------------------------------------------
def test_a_tracking_id_changed_after_it_was_written_starts_a_new_tracked_run(tmp_path, capsys):
    from dflash_train.tracking.base import save_run, saved_run

    save_run(tmp_path, "wandb", {"id": "run4711", "project": "p"})
    save_run(tmp_path, "mlflow", {"run_id": "abc"})  # the other entry kept, one checksum for the file
    assert saved_run(tmp_path, "wandb") == {"id": "run4711", "project": "p"}
    assert saved_run(tmp_path, "mlflow") == {"run_id": "abc"}
    _change(tmp_path / "tracking.json", "run4711", "run4712")  # another run's id: the resume would write into it
    assert saved_run(tmp_path, "wandb") == {}
    assert "tracking.json does not match its checksum" in capsys.readouterr().err
    (tmp_path / "tracking.json").write_text(json.dumps({"wandb": {"id": "old"}}))  # an older version's
    assert saved_run(tmp_path, "wandb") == {"id": "old"}


# -- 60.9 exported folders ----------------------------------------------------------------------------
def _export(tmp_path):
    from testkit import tiny_drafter, tiny_qwen3

    from dflash_train.export.serving import export_drafter
    from dflash_train.models.target import Target

    target = Target(tiny_qwen3())
    drafter, cfg = tiny_drafter(target)
    return export_drafter(drafter, cfg, tmp_path / "export", dtype=torch.float32), drafter


def test_an_exported_weight_changed_after_the_export_is_one_line_naming_the_file(tmp_path):
    from dflash_train.export.serving import load_drafter_folder

    folder, drafter = _export(tmp_path)
    assert "model.safetensors" in json.loads((folder / "checksums.json").read_text())
    load_drafter_folder(folder)  # the happy path
    weight = folder / "model.safetensors"
    raw = bytearray(weight.read_bytes())
    raw[-3] ^= 0x01  # a low mantissa bit of the last float: the file still loads
    weight.write_bytes(bytes(raw))
    with pytest.raises(UserFacingError, match=r"exported drafter .*: model\.safetensors does not match its sha256"):
        load_drafter_folder(folder)
    (folder / "checksums.json").unlink()  # an export by an older version (or a published folder) loads
    load_drafter_folder(folder)


def test_the_engines_read_an_export_with_its_checksums_json(tmp_path):
    """vLLM's and llama.cpp's readers take config.json and *.safetensors by name: the extra file is
    never read as a weight or config (our GGUF writer, which reads the folder as they do, works)."""
    from dflash_train.export.gguf import read_target_gguf, write_drafter_gguf

    folder, drafter = _export(tmp_path)
    target = target_gguf(tmp_path / "target.gguf", drafter.config.vocab_size)
    out = write_drafter_gguf(folder, target, dtype="float32")
    assert files.verify_sidecar(out) is None and (folder / "drafter.gguf.sha256").is_file()
    assert read_target_gguf(target).vocab_size == drafter.config.vocab_size


# -- 60.10 GGUF files --------------------------------------------------------------------------------
def test_a_gguf_changed_after_it_was_written_is_one_line_naming_it(tmp_path):
    from dflash_train.export.gguf import check_gguf, read_target_gguf, write_drafter_gguf

    folder, drafter = _export(tmp_path)
    target = target_gguf(tmp_path / "target.gguf", drafter.config.vocab_size)
    write_sidecar(target)  # as `llama-cpp convert` and fetch_smollm2_gguf write it
    assert read_target_gguf(target).vocab_size == drafter.config.vocab_size
    raw = target.read_bytes()
    target.write_bytes(raw.replace(b"t17", b"t71", 1))  # another token's text, same length: still parses
    with pytest.raises(UserFacingError, match=r"target GGUF .*target\.gguf does not match its checksum"):
        read_target_gguf(target)
    out = write_drafter_gguf(folder, _fresh_target(tmp_path, drafter), dtype="float32")
    check_gguf(out)  # the happy path
    raw = bytearray(out.read_bytes())
    raw[-5] ^= 0x01  # a weight's low bit: llama.cpp would load it
    out.write_bytes(bytes(raw))
    with pytest.raises(UserFacingError, match=r"drafter GGUF .*drafter\.gguf does not match its checksum"):
        check_gguf(out, "drafter GGUF")
    files.sidecar_path(out).unlink()  # a GGUF without one (not ours, or an older version's) is read as it is
    check_gguf(out)


def _fresh_target(tmp_path, drafter):
    return target_gguf(tmp_path / "target2.gguf", drafter.config.vocab_size)


def test_a_damaged_target_conversion_kept_by_eval_is_converted_again(tmp_path, monkeypatch):
    from dflash_train.eval import llamacpp as engine
    from dflash_train.llamacpp import build

    made = []

    def convert(model, out, outtype, log=None):
        made.append(out)
        Path(out).write_bytes(b"GGUF" + b"\x01" * 64)
        write_sidecar(out)
        return Path(out)

    monkeypatch.setattr(build, "convert_with_llamacpp", convert)
    args, lines = types.SimpleNamespace(target_gguf=None, target="t"), []
    path = engine._target_gguf(args, tmp_path, lines.append)
    engine._target_gguf(args, tmp_path, lines.append)
    assert len(made) == 1  # kept: not converted twice
    path.write_bytes(b"GGUF" + b"\x02" * 64)
    engine._target_gguf(args, tmp_path, lines.append)
    assert len(made) == 2 and "does not match its checksum" in lines[-2] and "converting the target again" in lines[-2]


# -- 60.11 the llama.cpp build ------------------------------------------------------------------------
def _fake_llamacpp(tmp_path, monkeypatch):
    from dflash_train.llamacpp import build

    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(build.BINARIES_ENV, raising=False)
    monkeypatch.setattr(build, "fetch_source", lambda sdist=None: tmp_path)
    monkeypatch.setattr(build, "_verified", set())
    relinked = []

    def cmake(cmd, log, what, cwd=None):
        if what == "cmake build":
            bin_dir = build.cache_dir() / "build" / "bin"
            bin_dir.mkdir(parents=True, exist_ok=True)
            for name in (*build.TARGETS, "libllama.so.0.6.0"):
                if not (bin_dir / name).exists():
                    relinked.append(name)
                    (bin_dir / name).write_bytes(b"\x7fELF" + name.encode() * 50)
                    os.chmod(bin_dir / name, 0o755)
            if not (bin_dir / "libllama.so").exists():
                (bin_dir / "libllama.so").symlink_to("libllama.so.0.6.0")

    monkeypatch.setattr(build, "_run", cmake)
    return build, relinked


def test_a_llamacpp_program_changed_after_the_build_is_relinked_with_one_line(tmp_path, monkeypatch, capsys):
    build, relinked = _fake_llamacpp(tmp_path, monkeypatch)
    record = build.build(echo=lambda line: None)
    assert sorted(record["files"]) == sorted(f"build/bin/{n}" for n in (*build.TARGETS, "libllama.so.0.6.0"))
    relinked.clear()
    monkeypatch.setattr(build, "_verified", set())
    build.find_binaries()  # the happy path: nothing rebuilt
    assert relinked == []
    server = build.cache_dir() / "build" / "bin" / "llama-server"
    raw = bytearray(server.read_bytes())
    raw[10] ^= 0x01  # same size, one bit: it would still run (or crash far from here)
    server.write_bytes(bytes(raw))
    monkeypatch.setattr(build, "_verified", set())
    build.find_binaries()
    assert relinked == ["llama-server"]
    err = capsys.readouterr().err
    assert "1 file(s) of the build" in err and "build/bin/llama-server" in err and "relinking them" in err
    monkeypatch.setattr(build, "_verified", set())
    relinked.clear()
    build.find_binaries()  # the new record verifies
    assert relinked == []


def test_a_llamacpp_build_marker_without_checksums_is_used_with_a_note(tmp_path, monkeypatch, capsys):
    build, relinked = _fake_llamacpp(tmp_path, monkeypatch)
    record = build.build(echo=lambda line: None)
    del record["files"]
    (build.cache_dir() / "BUILT").write_text(json.dumps(record))
    monkeypatch.setattr(build, "_verified", set())
    relinked.clear()
    build.find_binaries()
    assert relinked == [] and "records no checksums (built by an older version)" in capsys.readouterr().err


# -- 60.12 the vLLM install ---------------------------------------------------------------------------
def test_a_vllm_environment_changed_after_the_install_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from dflash_train.engine_setup import FILES, file_record
    from dflash_train.vllm import VllmError
    from dflash_train.vllm import install as vllm

    monkeypatch.setenv(vllm.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(vllm.PYTHON_ENV, raising=False)
    root = vllm.cache_dir()
    site = root / "venv" / "lib" / "python3.11" / "site-packages"
    for rel in ("vllm/__init__.py", "vllm/_version.py", "torch/__init__.py", "torch/version.py",
                "transformers/__init__.py"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(f"__version__ = '1.2.3'  # {rel}\n")
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "venv" / "bin").mkdir()
    (root / "venv" / "bin" / "python").write_text("#!/bin/sh\n")
    os.chmod(root / "venv" / "bin" / "python", 0o755)
    record = {"version": "x", FILES: file_record(root, vllm._key_files(root))}
    assert len(record[FILES]) == 6
    (root / "INSTALLED").write_text(json.dumps(record))
    assert vllm.find_python() == root / "venv" / "bin" / "python"  # the happy path
    (site / "vllm" / "_version.py").write_text("__version__ = '1.2.4'  # vllm/_version.py\n")  # same size
    with pytest.raises(VllmError, match=r"vllm: 1 key file\(s\) .*vllm/_version\.py.*reinstall it with "
                                        r"`dflash-train vllm install`"):
        vllm.find_python()
    del record[FILES]
    (root / "INSTALLED").write_text(json.dumps(record))  # an install by an older version
    assert vllm.find_python() == root / "venv" / "bin" / "python"
    assert "records no checksums (installed by an older version)" in capsys.readouterr().err


# -- 60.14 replay references --------------------------------------------------------------------------
def test_replay_references_changed_after_they_were_written_are_made_again(tmp_path, capsys):
    from dflash_train.eval.replay import load_or_make_references

    path, made = tmp_path / "refs.json", []

    def make():
        made.append(1)
        return [[101, 102, 103], [104, 105]]

    assert load_or_make_references(path, "k", make) == [[101, 102, 103], [104, 105]]
    assert load_or_make_references(path, "k", make) == [[101, 102, 103], [104, 105]]
    assert len(made) == 1  # the happy path: read back, not made again
    _change(path, "104", "140")  # still a list of ints: replays would be scored against a wrong decode
    assert load_or_make_references(path, "k", make) == [[101, 102, 103], [104, 105]]
    assert len(made) == 2 and "does not match its checksum" in capsys.readouterr().err
    path.write_text(json.dumps({"key": "k", "continuations": [[7]]}))  # an older version's file
    assert load_or_make_references(path, "k", make) == [[7]]
    assert "carries no checksum" in capsys.readouterr().err


# -- 60.1 the data cache's rebuilds, counted at the end of a run ----------------------------------------
def test_a_training_run_counts_the_data_cache_entries_it_rebuilt(tmp_path):
    import numpy as np
    from testkit import tiny_chat_job, tiny_chat_target

    from dflash_train.config import config_from_dict
    from dflash_train.data.cache import load_cached
    from dflash_train.train.loop import train

    smollm2 = Path(__file__).resolve().parents[2] / "assets" / "smollm2"
    if not smollm2.is_dir():
        pytest.skip("assets/smollm2 is not fetched (make assets)")
    job = tiny_chat_job(tmp_path, max_steps=1, loggers=["jsonl"])
    summary = train(config_from_dict(job), target=tiny_chat_target(smollm2), echo=lambda *a: None)
    assert "cache_entries_rebuilt" not in summary  # the happy path: nothing rebuilt, nothing said
    [entry] = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    ids = np.asarray(list(load_cached(entry)[0][0]["input_ids"])[:8], dtype="<i4").tobytes()
    raw = bytearray((entry / "data.arrow").read_bytes())
    at = raw.find(ids)
    assert at > 0
    raw[at:at + len(ids)] = bytes(len(ids))  # still Arrow, other token ids
    (entry / "data.arrow").write_bytes(bytes(raw))
    job["train"]["run_dir"] = str(tmp_path / "run2")
    lines = []
    summary = train(config_from_dict(job), target=tiny_chat_target(smollm2), echo=lines.append)
    assert summary["cache_entries_rebuilt"] == 1
    assert json.loads((tmp_path / "run2" / "summary.json").read_text())["cache_entries_rebuilt"] == 1
    assert any("data cache: 1 corrupt entry rebuilt during this run" in str(line) for line in lines)
