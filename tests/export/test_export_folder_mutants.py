"""The export folder around ``config.json``, pinned where mutation testing found it unchecked (issue 60.4).

``test_serving_mutants.py`` pins the config; these pin the rest of ``export/serving.py``: the README a
user copies the serve lines from, the shipped modeling source (which lines of a kind's network file are
dropped), the refusal of a shipped file that imports this package, the safetensors metadata that
transformers reads, a sharded (index) folder, the dtype a folder loads in, the target check's bounds and
every one-line message naming the file or folder it is about. The equivalent survivors, and why:
``docs/results/mutation/serving-triage.md``.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dflash_train.export import serving
from dflash_train.export.serving import (
    CONFIG_FILE,
    MODELING_FILE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    check_against_target,
    export_drafter,
    load_drafter_folder,
)
from dflash_train.files import CHECKSUMS
from dflash_train.models.kinds import kind_source
from dflash_train.models.target import Target, target_facts

sys.path.insert(0, str(Path(__file__).parents[1]))
from testkit import tiny_drafter, tiny_qwen3  # noqa: E402

_TINY = {}


def _tiny():
    """One tiny target and drafter for the module (block 4, layer ids [3] of 6, mask token 127)."""
    if not _TINY:
        model = tiny_qwen3()
        drafter, cfg = tiny_drafter(Target(model), num_layers=1)
        _TINY.update(model=model, drafter=drafter.eval(), cfg=cfg)
    return _TINY["model"], _TINY["drafter"], _TINY["cfg"]


@pytest.fixture
def exported(tmp_path) -> Path:
    _, drafter, cfg = _tiny()
    return export_drafter(drafter, cfg, tmp_path / "drafter")


GPU_LINE = ("vllm serve TARGET --speculative-config '{\"method\": \"dflash\", \"model\": \"THIS_FOLDER\", "
            "\"num_speculative_tokens\": 3}'   # vLLM 0.32.0 on a GPU\n")
README = (
    "# DFlash drafter\n\n"
    "Block-diffusion speculative-decoding drafter exported by `dflash-train export`.\n\n"
    "- block_size: 4\n"
    "- drafter layers: 1, hidden size 64\n"
    "- target layers read: [3] of 6 (vLLM numbering: [4])\n"
    "- mask_token_id: 127\n"
    "- weights: bfloat16\n\n"
    "The target's embedding and lm_head are not included.\n\n"
    "```bash\n"
    + GPU_LINE
    + "VLLM_CPU_KVCACHE_SPACE=2 \"$(dflash-train vllm path)\" -m vllm.entrypoints.openai.api_server --model TARGET "
    "--dtype float32 --enforce-eager --max-model-len 2048 --speculative-config '{\"method\": \"dflash\", "
    "\"model\": \"THIS_FOLDER\", \"num_speculative_tokens\": 3}'   # on a CPU\n"
    "python -m sglang.launch_server --model-path TARGET --speculative-algorithm DFLASH \\\n"
    "    --speculative-draft-model-path THIS_FOLDER --speculative-num-draft-tokens 4 --trust-remote-code\n"
    "```\n\n"
    "```python\n"
    "draft = AutoModel.from_pretrained(THIS_FOLDER, trust_remote_code=True, dtype=\"auto\").eval()\n"
    "out = draft.spec_generate(target=target, input_ids=ids, max_new_tokens=256, temperature=0.0,\n"
    "                          stop_token_ids=[tokenizer.eos_token_id])\n"
    "```\n"
)


def test_readme_word_for_word(exported):
    """B - 1 = 3 drafts for vLLM, B = 4 for SGLang, layer ids + 1 in vLLM's numbering."""
    assert (exported / "README.md").read_text(encoding="utf-8") == README


def test_vllm_lines_of_a_kind_vllm_drafts_only_on_a_gpu():
    assert serving._vllm_lines("dspark", 8) == (
        "vllm serve TARGET --speculative-config '{\"method\": \"dspark\", \"model\": \"THIS_FOLDER\", "
        "\"num_speculative_tokens\": 7}'   # vLLM 0.32.0 on a GPU\n"
        "# (vLLM drafts this kind on a GPU only: its V2 model runner)\n")
    assert serving.vllm_cpu_line("dspark", "T", "D", 8) is None
    assert serving.vllm_cpu_line("dflash", "T", "D", 8).startswith(
        "VLLM_CPU_KVCACHE_SPACE=2 \"$(dflash-train vllm path)\" -m vllm.entrypoints.openai.api_server --model T ")


def test_weights_metadata_and_json_layout(exported):
    """transformers refuses a safetensors file whose metadata has no ``format`` of pt/tf/flax/mlx;
    config.json is indented for the people who read it, the checksums file as ``integrity`` writes it."""
    with safe_open(str(exported / WEIGHTS_FILE), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    text = (exported / CONFIG_FILE).read_text(encoding="utf-8")
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
    sums = (exported / CHECKSUMS).read_text(encoding="utf-8")
    assert sums == json.dumps(json.loads(sums), indent=1)


@pytest.mark.parametrize("line, module", [
    ("from . import drafter", "."), ("from ..models import drafter", "..models"),
    ("import torch, dflash_train.models", "torch,dflash_train.models"),
    ("from dflash_train.models.config import DrafterConfig", "dflash_train.models.config"),
])
def test_a_shipped_source_importing_this_package_is_refused(line, module):
    with pytest.raises(ValueError) as err:
        serving._own_imports(f"import torch\n{line}\n", "models/x.py")
    assert str(err.value) == (f"models/x.py imports {module!r}; it must import only torch (and the backbone) so "
                              f"it can be shipped as {MODELING_FILE}")


def test_allowed_and_outside_imports_pass():
    serving._own_imports("import torch\nfrom torch import nn\nfrom dflash_train.models.drafter import X\n",
                         "k.py", allowed=("dflash_train.models.drafter",))
    serving._own_imports("from __future__ import annotations\nimport os, math\n", "k.py")
    with pytest.raises(ValueError, match="'dflash_train.models.drafter'"):
        serving._own_imports("from dflash_train.models.drafter import X\n", "k.py")


def test_the_shipped_files_refusals_name_them(monkeypatch):
    monkeypatch.setattr(serving.resources, "files", lambda _: SimpleNamespace(
        joinpath=lambda _: SimpleNamespace(read_text=lambda encoding: "from . import x\n")))
    with pytest.raises(ValueError, match=r"^models/drafter\.py imports '\.'"):
        serving.drafter_source()
    monkeypatch.setattr(serving, "kind_source", lambda name: "from .other import y\n")
    with pytest.raises(ValueError, match=r"^models/kinds/dspark\.py imports '\.other'"):
        serving.kind_network_source("dspark")


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_a_kinds_network_drops_its_future_and_backbone_imports_only(kind):
    text = kind_source(kind)
    kept = [line for line in text.splitlines()
            if not line.startswith(("from __future__ import", "from dflash_train.models.drafter import"))]
    assert len(kept) == len(text.splitlines()) - 2
    banner = f"# ---- models/kinds/{kind}.py (drafter.kind={kind}), appended by dflash-train export ----"
    assert serving.kind_network_source(kind) == "\n\n" + banner + "\n" + "\n".join(kept) + "\n"


def test_modeling_source_is_the_backbone_then_the_wrapper():
    wrapper = (Path(serving.__file__).parent / "modeling_wrapper.py.txt").read_text(encoding="utf-8")
    backbone = serving.drafter_source()
    assert backbone.endswith("\n") and not backbone.endswith("\n\n")
    assert serving.modeling_source() == serving.modeling_source("dflash") == backbone + wrapper


def _sharded(folder: Path) -> dict[str, torch.Tensor]:
    """Rewrite an export's weights as two shards and an index, as large published drafters ship."""
    tensors = load_file(str(folder / WEIGHTS_FILE))
    (folder / WEIGHTS_FILE).unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, part in shards.items():
        save_file({k: tensors[k] for k in part}, str(folder / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: shard for shard, part in shards.items() for k in part}}
    (folder / WEIGHTS_INDEX_FILE).write_text(json.dumps(index))
    (folder / CHECKSUMS).unlink()  # a published folder carries none
    return tensors


def test_a_sharded_folder_loads_every_shard(exported):
    tensors = _sharded(exported)
    drafter, _ = load_drafter_folder(exported, dtype=torch.bfloat16)
    state = drafter.state_dict()
    assert sorted(state) == sorted(tensors)
    assert all(torch.equal(state[k], tensors[k]) for k in tensors)


def test_a_sharded_folders_errors_name_the_index(exported):
    index = exported / WEIGHTS_INDEX_FILE
    tensors = _sharded(exported)
    first_shard = exported / "model-00001-of-00002.safetensors"
    kept = sorted(load_file(str(first_shard)))
    dropped = kept.pop(0)
    save_file({k: tensors[k] for k in kept}, str(first_shard), metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        load_drafter_folder(exported)
    assert str(err.value) == (f"{index} does not match the DFlash serving layout for this config: "
                              f"missing tensors: {dropped}")
    index.write_text(json.dumps({"weights": {}}))
    with pytest.raises(ValueError) as err:
        load_drafter_folder(exported)
    assert str(err.value) == f"{index}: no 'weight_map' object"


def test_a_single_file_wins_over_an_index(exported):
    (exported / WEIGHTS_INDEX_FILE).write_text(json.dumps({"weight_map": {"x": "absent.safetensors"}}))
    (exported / CHECKSUMS).unlink()
    drafter, _ = load_drafter_folder(exported)
    assert sorted(drafter.state_dict()) == sorted(load_file(str(exported / WEIGHTS_FILE)))


def test_a_folder_loads_in_the_dtype_asked_for(exported):
    """The export is bfloat16; the loader's default is float32 (what the eval path computes in)."""
    assert {p.dtype for p in load_drafter_folder(exported)[0].parameters()} == {torch.float32}
    assert {p.dtype for p in load_drafter_folder(exported, dtype=torch.bfloat16)[0].parameters()} == {torch.bfloat16}


def test_load_errors_name_the_file_they_are_about(exported):
    config = json.loads((exported / CONFIG_FILE).read_text())
    del config["dflash_config"]
    (exported / CONFIG_FILE).write_text(json.dumps(config))
    (exported / CHECKSUMS).unlink()
    with pytest.raises(ValueError) as err:
        load_drafter_folder(exported)
    assert str(err.value) == f"{exported / CONFIG_FILE}: not a DFlash drafter config (no 'dflash_config' object)"


def test_weights_errors_name_the_weights_file(exported):
    tensors = load_file(str(exported / WEIGHTS_FILE))
    extra = {**tensors, "stray.weight": torch.zeros(2)}
    save_file(extra, str(exported / WEIGHTS_FILE), metadata={"format": "pt"})
    (exported / CHECKSUMS).unlink()
    with pytest.raises(ValueError) as err:
        load_drafter_folder(exported)
    assert str(err.value) == (f"{exported / WEIGHTS_FILE} does not match the DFlash serving layout for this "
                              "config: unexpected tensors: stray.weight")


def _facts(**changes):
    model, _, _ = _tiny()
    facts = target_facts(model.config)
    return type(facts)(**{**vars(facts), **changes})


def test_a_target_mismatch_names_the_folder(exported):
    with pytest.raises(ValueError) as err:
        load_drafter_folder(exported, _facts(vocab_size=100))
    assert str(err.value) == (f"drafter {exported} does not fit this target: vocab_size 128 != the target's vocab "
                              "size 100; mask_token_id 127 has no row in the target's embedding table (100 rows)")


def test_check_against_target_bounds_and_words():
    _, _, cfg = _tiny()
    at = lambda **c: dataclasses.replace(cfg, **c)  # noqa: E731
    assert check_against_target(at(mask_token_id=0), _facts()) is not None
    assert check_against_target(at(mask_token_id=127), _facts()).mask_token_id == 127  # vocab 128: the last row
    assert check_against_target(at(mask_token_id=None), _facts()).mask_token_id is None
    with pytest.raises(ValueError) as err:
        check_against_target(at(mask_token_id=128), _facts())
    assert str(err.value) == ("drafter does not fit this target: mask_token_id 128 has no row in the target's "
                              "embedding table (128 rows)")
    with pytest.raises(ValueError) as err:
        check_against_target(at(target_layer_ids=[1, 6], num_target_layers=None), _facts())
    assert str(err.value) == ("drafter does not fit this target: target_layer_ids [6] out of range for a target "
                              "with 6 layers (valid: 0..4)")


def test_target_facts_from_every_kind_of_target():
    """TargetFacts, a HF model, a HF config, a composite config (text part behind get_text_config)
    and a plain object with the fields all give the same facts; anything else is one TypeError."""
    model, _, _ = _tiny()
    facts = target_facts(model.config)
    composite = SimpleNamespace(get_text_config=lambda: model.config)
    plain = SimpleNamespace(**vars(facts))  # a config-like object without get_text_config
    for target in (facts, model, model.config, composite, plain):
        assert serving._as_target_facts(target) == facts, type(target)
    with pytest.raises(TypeError) as err:
        serving._as_target_facts(3)
    assert str(err.value) == ("cannot read target facts from int; pass TargetFacts, Target, a HF model or a HF "
                              "config")


def test_an_unreadable_weights_file_is_one_line_naming_it(exported, monkeypatch):
    weights = exported / WEIGHTS_FILE
    real_open = builtins.open

    def refusing(path, *args, **kwargs):
        if str(path) == str(weights):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    with pytest.raises(Exception) as err:
        serving.read_safetensors(weights)
    assert type(err.value).__name__ == "UserFacingError"
    assert str(err.value).startswith(f"cannot read {weights}")


def test_export_refusals_word_for_word(tmp_path):
    _, drafter, cfg = _tiny()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError) as err:
        export_drafter(drafter, cfg, tmp_path / "file")
    assert str(err.value) == f"export destination {tmp_path / 'file'} exists and is not a folder"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError) as err:
        export_drafter(drafter, cfg, tmp_path / "full")
    assert str(err.value) == (f"export destination {tmp_path / 'full'} already exists and is not empty; pass --force "
                              "(force=True) to replace it")
    state = dict(drafter.state_dict())
    state["stray.weight"] = torch.zeros(1)
    bad = SimpleNamespace(state_dict=lambda: state)
    with pytest.raises(ValueError, match=r"^the drafter's state_dict does not match the DFlash serving layout"):
        export_drafter(bad, cfg, tmp_path / "bad")


def test_a_failed_write_names_the_export_and_what_to_do(tmp_path, monkeypatch):
    _, drafter, cfg = _tiny()
    import safetensors.torch

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(Exception) as err:
        export_drafter(drafter, cfg, tmp_path / "out")
    message = str(err.value)
    assert message.startswith(f"cannot write export {tmp_path / 'out'}")
    assert message.endswith("free space or choose another output folder")
    assert not (tmp_path / "out").exists()


def test_a_written_file_that_lost_a_tensor_is_named(exported):
    _, _, cfg = _tiny()
    tensors = load_file(str(exported / WEIGHTS_FILE))
    dropped = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(exported / WEIGHTS_FILE))
    with pytest.raises(ValueError) as err:
        serving._check_written(exported, cfg)
    assert str(err.value) == (f"{exported / WEIGHTS_FILE} does not match the DFlash serving layout for this config: "
                              f"missing tensors: {dropped}")


def test_a_forced_replace_whose_second_rename_fails_puts_the_old_export_back(tmp_path, monkeypatch):
    """``force``: the old folder is renamed aside, the new one renamed in; if that second rename
    fails, the old one goes back to ``out`` whole and nothing is left beside it."""
    _, drafter, cfg = _tiny()
    out = export_drafter(drafter, cfg, tmp_path / "drafter")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace = serving.os.replace

    def second_rename_fails(src, dst):
        if Path(dst) == out and ".tmp-" in Path(src).name:
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(serving.os, "replace", second_rename_fails)
    with pytest.raises(Exception) as err:
        export_drafter(drafter, cfg, out, force=True, dtype=torch.float32)
    assert str(err.value).startswith(f"cannot write export {out}: input/output error")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]


def test_a_failed_checksums_write_names_it(tmp_path, monkeypatch):
    """The checksums file is the last one written (atomically, fsynced) into the staged folder."""
    _, drafter, cfg = _tiny()

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(serving.os, "fsync", full)
    with pytest.raises(Exception) as err:
        export_drafter(drafter, cfg, tmp_path / "out")
    assert str(err.value).startswith("cannot write export checksums ")
    assert f"/{CHECKSUMS}: no space left on the device" in str(err.value)
    assert list(tmp_path.iterdir()) == []
