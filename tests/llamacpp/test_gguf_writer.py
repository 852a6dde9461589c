"""The GGUF writer on a tiny export (no llama.cpp needed; tests/llamacpp/test_engine.py holds it to
llama.cpp's own converter): names, numbering, types, the copied vocabulary, refusals."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.export.gguf import EXPLICIT_KEYS, GGUF_FILE, KINDS, write_drafter_gguf
from dflash_train.export.serving import export_drafter, serving_tensor_names
from dflash_train.models.target import Target


def _target_gguf(path, vocab: int, arch: str = "qwen3", hidden: int | None = None, layers: int | None = None):
    """A vocabulary-only GGUF standing in for the target's (what the writer reads of it)."""
    writer = gguf.GGUFWriter(str(path), arch)
    if hidden is not None:
        writer.add_uint32(f"{arch}.embedding_length", hidden)
        writer.add_uint32(f"{arch}.block_count", layers)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(vocab)])
    writer.add_array("tokenizer.ggml.token_type", [1] * vocab)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


KIND_OPTIONS = {"dflash": {}, "dflash2": {"selector_rank": 8, "selector_top_k": 4, "conv_group_size": 8},
                "dspark": {"markov_rank": 8}}


@pytest.fixture(params=sorted(KIND_OPTIONS))
def exported(request, tmp_path):
    target = Target(tiny_qwen3())
    drafter, cfg = tiny_drafter(target, kind=request.param, options=KIND_OPTIONS[request.param])
    folder = export_drafter(drafter, cfg, tmp_path / "drafter", dtype=torch.float32)
    facts = target.facts
    tg = _target_gguf(tmp_path / "target.gguf", cfg.vocab_size, hidden=facts.hidden_size,
                      layers=facts.num_hidden_layers)
    return folder, cfg, drafter, tg


def test_keys_tensors_and_vocabulary(exported):
    folder, cfg, drafter, target = exported
    path = write_drafter_gguf(folder, target, dtype="bfloat16")
    assert path == folder / GGUF_FILE
    reader = gguf.GGUFReader(str(path))
    f = reader.fields
    assert f["general.architecture"].contents() == "dflash"
    assert f["dflash.target_layers"].contents() == [i + 1 for i in cfg.target_layer_ids]  # llama.cpp's numbering
    assert f["dflash.block_size"].contents() == cfg.block_size
    assert f["tokenizer.ggml.mask_token_id"].contents() == cfg.mask_token_id
    assert f["tokenizer.ggml.tokens"].contents()[:3] == ["t0", "t1", "t2"]  # the target's, copied
    assert all(f[k].contents() is False for k in EXPLICIT_KEYS)
    assert ("dflash.selector_top_k" in f) == (cfg.kind == "dflash2")
    assert ("dflash.has_confidence_head" in f) == (cfg.kind == "dspark")
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(serving_tensor_names(cfg))  # every serving tensor, once
    assert tensors["enc.output_norm.weight"].tensor_type.name == "F32"  # norms stay float32
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == "BF16"
    fc = np.asarray(tensors["fc.weight"].data).view(np.uint16).astype(np.uint32) << 16
    assert np.array_equal(fc.view(np.float32).reshape(drafter.fc.weight.shape),
                          drafter.fc.weight.detach().to(torch.bfloat16).float().numpy())


def test_refusals_name_the_problem(exported, tmp_path):
    folder, cfg, _, _ = exported
    small = _target_gguf(tmp_path / "small.gguf", cfg.vocab_size - 1)
    with pytest.raises(ValueError, match="vocab_size"):
        write_drafter_gguf(folder, small)
    other = _target_gguf(tmp_path / "qwen2.gguf", cfg.vocab_size, arch="qwen2")
    with pytest.raises(ValueError, match="'qwen2'"):
        write_drafter_gguf(folder, other)
    with pytest.raises(FileNotFoundError, match="llama-cpp convert"):
        write_drafter_gguf(folder, tmp_path / "missing.gguf")
    assert not (folder / GGUF_FILE).exists()  # nothing half-written


def test_one_entry_per_serving_architecture():
    """Every registered drafter kind can be written for llama.cpp, with its spec type."""
    from dflash_train.export.gguf import spec_type
    from dflash_train.models.kinds import get_kind, kind_names

    assert set(KINDS) == {get_kind(name).architecture for name in kind_names()}
    assert {KINDS[arch]({"num_hidden_layers": 1, "dflash_config": {"conv_kernel_size": 2, "conv_group_size": 8,
                                                                    "selector_rank": 4, "selector_top_k": 4}}
                        ).spec_type for arch in KINDS} == {"draft-dflash", "draft-dspark"}
    assert callable(spec_type)


def test_dspark_tensors_keep_their_values_and_the_confidence_head_is_announced(tmp_path):
    """The Markov head's two matrices and the confidence projection as llama.cpp names and shapes
    them (GGUF dims reversed from torch's), float32 values unchanged; without the head, no conf_proj
    and has_confidence_head false."""
    target = Target(tiny_qwen3())
    facts = target.facts
    for confidence in (True, False):
        drafter, cfg = tiny_drafter(target, kind="dspark", options={"markov_rank": 8, "confidence_head": confidence})
        folder = export_drafter(drafter, cfg, tmp_path / f"d{confidence}", dtype=torch.float32)
        tg = _target_gguf(tmp_path / f"t{confidence}.gguf", cfg.vocab_size, hidden=facts.hidden_size,
                          layers=facts.num_hidden_layers)
        reader = gguf.GGUFReader(str(write_drafter_gguf(folder, tg)))
        tensors = {t.name: t for t in reader.tensors}
        assert reader.fields["dflash.has_confidence_head"].contents() is confidence
        assert ("conf_proj.weight" in tensors) is confidence
        w1 = drafter.markov_head.markov_w1.weight.detach().numpy()
        assert [int(x) for x in tensors["markov_w1.weight"].shape] == [8, cfg.vocab_size]
        assert np.array_equal(np.asarray(tensors["markov_w1.weight"].data).reshape(w1.shape), w1)
        if confidence:
            assert [int(x) for x in tensors["conf_proj.weight"].shape] == [cfg.hidden_size + 8, 1]
