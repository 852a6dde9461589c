"""Served for real: our drafters in the pinned llama.cpp (``make llama-cpp`` builds it; ``make test`` does).

Marked ``llamacpp``: these need the build (~/.cache/dflash_train/llama.cpp/<version>/). Without it
they skip on a developer's machine and **fail in CI** (``CI`` set), where ``make test`` builds it first.

- the GGUF writer against llama.cpp's own converter (keys, types, tensor bytes), every kind;
- the supported target architectures against the pinned source;
- end to end on drafters trained here on the CPU to accept (SmolLM2's own greedy answers to three
  prompts, memorized): export ``--gguf``, ``eval --engine llama.cpp``, and llama.cpp's output =
  its plain greedy = our plain greedy, with the per-step acceptance equal to ours between the ends.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from served import KINDS, NEW_TOKENS, prompts_file, random_serving_folder, train_memorized, write_answers

from dflash_train.cli import main

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]


def _require_build():
    from dflash_train.llamacpp.build import find_binaries, source_dir

    try:
        return find_binaries(), source_dir()
    except FileNotFoundError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the llama.cpp tests: {err}")
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def build():
    return _require_build()


@pytest.fixture(scope="module")
def target_gguf(build, smollm2_path, tmp_path_factory):
    from dflash_train.llamacpp.build import convert_with_llamacpp

    return convert_with_llamacpp(smollm2_path, tmp_path_factory.mktemp("target") / "target-f32.gguf")


def _gguf_contents(path: Path) -> tuple[dict, dict]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    keys = {k: (tuple(int(t) for t in f.types), [bytes(f.parts[i]) for i in f.data])
            for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (t.tensor_type.name, [int(x) for x in t.shape], np.asarray(t.data).tobytes())
               for t in reader.tensors}
    return keys, tensors


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gguf_writer_matches_llamacpps_converter(build, target_gguf, smollm2_path, tmp_path, kind, dtype):
    """Our writer and llama.cpp's convert_hf_to_gguf.py on one serving folder: the same keys with the
    same types and values (the file's name aside; the two keys we state in addition), the same
    tensors, types, shapes and bytes. A drift of either side fails here."""
    from dflash_train.export.gguf import EXPLICIT_KEYS, NAMING_KEYS, write_drafter_gguf
    from dflash_train.llamacpp.build import convert_with_llamacpp

    folder = random_serving_folder(kind, smollm2_path, tmp_path / "drafter")
    ours = write_drafter_gguf(folder, target_gguf, tmp_path / "ours.gguf", dtype)
    outtype = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    theirs = convert_with_llamacpp(folder, tmp_path / "theirs.gguf", outtype, target_model_dir=smollm2_path)
    our_keys, our_tensors = _gguf_contents(ours)
    their_keys, their_tensors = _gguf_contents(theirs)
    for name in NAMING_KEYS:
        our_keys.pop(name, None), their_keys.pop(name, None)
    # the keys we state that the converter leaves to llama.cpp's defaults (it writes sample_from_anchor for DSpark)
    assert sorted(set(our_keys) - set(their_keys)) == sorted(k for k in EXPLICIT_KEYS if k not in their_keys)
    assert kind != "dspark" or "dflash.sample_from_anchor" in their_keys
    assert not set(their_keys) - set(our_keys)
    assert [k for k in their_keys if their_keys[k] != our_keys[k]] == []
    assert sorted(our_tensors) == sorted(their_tensors)
    assert [n for n in our_tensors if our_tensors[n] != their_tensors[n]] == []
    assert our_keys["dflash.target_layers"][1] == [np.int32(i).tobytes() for i in (2, 8, 14)]  # ours + 1


def test_supported_architectures_are_the_pinned_sources(build):
    from dflash_train.llamacpp import SUPPORTED_TARGET_ARCHITECTURES, architectures_from_source

    assert architectures_from_source(build[1]) == SUPPORTED_TARGET_ARCHITECTURES


# -- end to end ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def answers(build, smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2's own greedy answers to the prompts, as a chat file to train on."""
    return write_answers(smollm2_path, tmp_path_factory.mktemp("data") / "answers.jsonl")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_llamacpp_drafts_what_we_draft(kind, build, answers, target_gguf, smollm2_path, tmp_path):
    run, drafter, out = tmp_path / "run", tmp_path / "drafter", tmp_path / "eval"
    prompts = prompts_file(tmp_path / "prompts.txt")
    train_memorized(kind, smollm2_path, answers, run)
    assert main(["export", str(run), str(drafter), "--dtype", "float32", "--gguf", str(target_gguf)]) == 0
    assert (drafter / "drafter.gguf").is_file()
    code = main(["eval", "--engine", "llama.cpp", "--target", str(smollm2_path), "--drafter", str(drafter),
                 "--target-gguf", str(target_gguf), "--prompts", str(prompts), "--max-new-tokens", str(NEW_TOKENS),
                 "--out", str(out)])
    report = json.loads((out / "eval.json").read_text())
    s = report["summary"]
    assert code == 0, s
    assert s["engine_lossless"] and s["engine_plain_equals_ours"] and s["prompt_ids_equal"], s
    assert s["partings"] == [] and s["partings_near_ties"], s
    assert all(r["ours_lossless"] and r["prompt_ids_equal"] is True for r in report["prompts"])
    assert s["aligned_equal"] and s["aligned_steps_compared"] >= 12 and s["aligned_ends_consistent"], s
    accepted = [a for r in report["prompts"] for a in r["alignment"]["ours"]]
    assert sum(a > 0 for a in accepted) >= len(accepted) // 2, accepted  # a drafter that accepts
    assert s["ours_tau"] > 2.0 and s["engine_tau"] > 2.0, s
