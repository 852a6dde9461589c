"""The drafter as a GGUF file that llama.cpp serves (``dflash-train export RUN OUT --gguf TARGET.gguf``).

llama.cpp (build 11434, ``--spec-type draft-dflash``) loads a DFlash drafter as a model of
architecture ``dflash``: the drafter's own layers, ``fc`` and the two norms, metadata keys that
say how to run it, and a tokenizer that must be the target's (llama.cpp takes the mask token
from the drafter's vocabulary). This module writes that file with the ``gguf`` package from
the **serving folder** (``config.json`` + ``model.safetensors``, docs/spec.md section 4), not
from training internals, so it reads exactly what vLLM and SGLang read.

Where each part comes from:

- the **vocabulary**: every ``tokenizer.*`` key of the target's GGUF, copied byte for byte,
  then ``tokenizer.ggml.mask_token_id``. The target GGUF is the file llama.cpp will serve the
  drafter with, so the two vocabularies are equal by construction (llama.cpp's own converter
  rebuilds the same keys from the target's Hugging Face folder: ``--target-model-dir``);
- the **common keys** (:func:`common_keys`): the shape, rope, the layers it reads in
  llama.cpp's numbering (``dflash.target_layers`` = our ``target_layer_ids + 1``: llama.cpp
  captures the *input* of layer j, vLLM's convention), ``dflash.block_size``, and two keys
  llama.cpp reads that its converter leaves to their defaults, written here so that the
  file states our layout: ``dflash.attention.causal = false`` (the block attends both ways)
  and ``dflash.sample_from_anchor = false`` (drafts come from the mask slots 1..B-1; the
  anchor's slot predicts nothing; llama.cpp reads it only with a DSpark Markov head);
- one **kind entry** per serving architecture (:data:`KINDS`): a function of the serving
  config that returns the kind's extra keys, its tensor names and the ``--spec-type`` llama.cpp
  serves it with. DFlash2 adds the convolution and selector keys and tensors; DSpark the Markov
  and confidence heads (``draft-dspark``).

Tensor types follow llama.cpp's converter: 1-D tensors, norms and names without ``.weight``
(DFlash2's ``attn_conv_base``) stay float32, the rest take ``dtype``. A test converts the same
folder with llama.cpp's ``convert_hf_to_gguf.py`` and compares keys, types and tensor bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dflash_train.files import UserFacingError, forget_sidecar, verify_sidecar, write_sidecar

ARCH = "dflash"
GGUF_FILE = "drafter.gguf"  # written into the serving folder by ``export --gguf``
# keys we write that llama.cpp's converter leaves out (llama.cpp reads them; their defaults differ
# from or only coincide with our layout): the comparison test allows exactly these
EXPLICIT_KEYS = ("dflash.attention.causal", "dflash.sample_from_anchor")
# keys that name the file rather than the model (the converter derives them from the folder's name)
NAMING_KEYS = ("general.name", "general.size_label")
MASK_TOKEN_KEY = "tokenizer.ggml.mask_token_id"

# llama.cpp's LlamaFileType (general.file_type) and tensor type per export dtype
_FILE_TYPES = {"float32": 0, "float16": 1, "bfloat16": 32}


@dataclass
class KV:
    """One metadata entry: ``kind`` is a ``gguf.GGUFValueType`` name (UINT32, FLOAT32, BOOL,
    STRING, ARRAY); ``sub`` the element type of an ARRAY."""

    key: str
    value: Any
    kind: str
    sub: str | None = None


@dataclass
class KindPart:
    """What one drafter kind adds to the common part: keys, ``serving name -> GGUF name``, and the
    ``--spec-type`` llama.cpp serves it with."""

    keys: list[KV] = field(default_factory=list)
    tensors: dict[str, str] = field(default_factory=dict)
    spec_type: str = "draft-dflash"


# -- tensor names -------------------------------------------------------------------------------

_LAYER_TENSORS = {  # serving name inside layers.{i}. -> llama.cpp's blk.{i}. name
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_GLOBAL_TENSORS = {"norm.weight": "output_norm.weight", "fc.weight": "fc.weight",
                   "hidden_norm.weight": "enc.output_norm.weight"}
_DFLASH2_LAYER_TENSORS = {
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
_DFLASH2_GLOBAL_TENSORS = {
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
}


def _per_layer(table: Mapping[str, str], layers: int) -> dict[str, str]:
    return {f"layers.{i}.{ours}": f"blk.{i}.{theirs}" for i in range(layers) for ours, theirs in table.items()}


# -- keys ---------------------------------------------------------------------------------------

def _dflash_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return dict(config.get("dflash_config") or {})


def _rope_keys(config: Mapping[str, Any], source: str) -> list[KV]:
    """rope: ``freq_base``; linear and YaRN scaling as llama.cpp's converter writes them; any
    other scaling is refused (llama.cpp's converter warns and drops it: a silent mismatch)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = params.get("rope_theta", config.get("rope_theta"))
    keys = [KV(f"{ARCH}.rope.freq_base", float(theta), "FLOAT32")] if theta is not None else []
    rope_type, factor = params.get("rope_type", params.get("type")), params.get("factor")
    if rope_type in (None, "default"):
        return keys
    if rope_type == "linear" and factor is not None:
        return keys + [KV(f"{ARCH}.rope.scaling.type", "linear", "STRING"),
                       KV(f"{ARCH}.rope.scaling.factor", float(factor), "FLOAT32")]
    if rope_type == "yarn" and factor is not None:
        keys += [KV(f"{ARCH}.rope.scaling.type", "yarn", "STRING"),
                 KV(f"{ARCH}.rope.scaling.factor", float(factor), "FLOAT32"),
                 KV(f"{ARCH}.rope.scaling.original_context_length",
                    int(params["original_max_position_embeddings"]), "UINT32")]
        optional = {"extrapolation_factor": "yarn_ext_factor", "attention_factor": "yarn_attn_factor",
                    "beta_fast": "yarn_beta_fast", "beta_slow": "yarn_beta_slow"}
        return keys + [KV(f"{ARCH}.rope.scaling.{name}", float(params[k]), "FLOAT32")
                       for k, name in optional.items() if params.get(k) is not None]
    raise ValueError(f"{source}: rope scaling {rope_type!r} is not written to GGUF (linear and yarn are); "
                     f"llama.cpp's converter would drop it too")


def _sliding_keys(config: Mapping[str, Any]) -> list[KV]:
    layer_types = list(config.get("layer_types") or [])
    if not (config.get("use_sliding_window") and config.get("sliding_window")):
        return []
    return [KV(f"{ARCH}.attention.sliding_window", int(config["sliding_window"]), "UINT32"),
            KV(f"{ARCH}.attention.sliding_window_pattern", [t == "sliding_attention" for t in layer_types],
               "ARRAY", "BOOL")]


def common_keys(config: Mapping[str, Any], source: str = "config.json") -> list[KV]:
    """The keys every DFlash-family drafter carries (shape, rope, target layers, block size)."""
    if config.get("attention_bias"):
        raise ValueError(f"{source}: attention_bias drafters are not served by llama.cpp's dflash graph "
                         f"(it loads no q/k/v/o biases)")
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    dflash = _dflash_config(config)
    layer_ids = [int(i) for i in dflash["target_layer_ids"]]
    keys = [
        KV(f"{ARCH}.block_count", int(config["num_hidden_layers"]), "UINT32"),
        KV(f"{ARCH}.context_length", int(config.get("max_position_embeddings") or 32768), "UINT32"),
        KV(f"{ARCH}.embedding_length", int(config["hidden_size"]), "UINT32"),
        KV(f"{ARCH}.feed_forward_length", int(config["intermediate_size"]), "UINT32"),
        KV(f"{ARCH}.attention.head_count", heads, "UINT32"),
        KV(f"{ARCH}.attention.head_count_kv", int(config.get("num_key_value_heads") or heads), "UINT32"),
        *_rope_keys(config, source),
        KV(f"{ARCH}.attention.layer_norm_rms_epsilon", float(config.get("rms_norm_eps", 1e-6)), "FLOAT32"),
        KV(f"{ARCH}.attention.key_length", head_dim, "UINT32"),
        KV(f"{ARCH}.attention.value_length", head_dim, "UINT32"),
        KV(f"{ARCH}.block_size", int(dflash.get("block_size", config["block_size"])), "UINT32"),
        # llama.cpp numbers a capture point by the layer whose input it is (ours + 1), like vLLM
        KV(f"{ARCH}.target_layers", [i + 1 for i in layer_ids], "ARRAY", "INT32"),
        *_sliding_keys(config),
        KV(f"{ARCH}.attention.causal", False, "BOOL"),
        KV(f"{ARCH}.sample_from_anchor", False, "BOOL"),
    ]
    return keys


def _dflash_part(config: Mapping[str, Any]) -> KindPart:
    """DFlash: the decoder layers, ``fc`` (target features -> hidden), its norm and the final norm."""
    layers = int(config["num_hidden_layers"])
    return KindPart([], {**_GLOBAL_TENSORS, **_per_layer(_LAYER_TENSORS, layers)})


def _dflash2_part(config: Mapping[str, Any]) -> KindPart:
    """DFlash2: DFlash plus each layer's two dynamic convolutions and the candidate selector,
    with the four keys that shape them (llama.cpp refuses a DFlash2 file without them)."""
    part = _dflash_part(config)
    dflash = _dflash_config(config)
    part.keys += [KV(f"{ARCH}.{name}", int(dflash[name]), "UINT32")
                  for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")]
    part.tensors.update(_DFLASH2_GLOBAL_TENSORS)
    part.tensors.update(_per_layer(_DFLASH2_LAYER_TENSORS, int(config["num_hidden_layers"])))
    return part


_DSPARK_MARKOV_TENSORS = {"markov_head.markov_w1.weight": "markov_w1.weight",
                          "markov_head.markov_w2.weight": "markov_w2.weight"}
_DSPARK_CONFIDENCE_TENSORS = {"confidence_head.proj.weight": "conf_proj.weight",
                              "confidence_head.proj.bias": "conf_proj.bias"}


def _dspark_part(config: Mapping[str, Any]) -> KindPart:
    """DSpark: DFlash plus the Markov head (``markov_w1`` [vocab, r] embeds the previous token,
    ``markov_w2`` maps it to a logit bias: llama.cpp builds the chain in its graph, greedy, with the
    anchor as slot 1's predecessor) and the optional confidence head, which ``has_confidence_head``
    announces. Served with ``--spec-type draft-dspark``; ``dflash.sample_from_anchor = false`` (a
    common key) keeps DFlash's block: drafts at slots 1..B-1, the anchor a bonus slot."""
    part = _dflash_part(config)
    confidence = bool(config.get("has_confidence_head", True))
    part.keys.append(KV(f"{ARCH}.has_confidence_head", confidence, "BOOL"))
    part.tensors.update(_DSPARK_MARKOV_TENSORS)
    if confidence:
        part.tensors.update(_DSPARK_CONFIDENCE_TENSORS)
    part.spec_type = "draft-dspark"
    return part


# One entry per serving architecture (config.json "architectures"): the kind's keys, tensor names and
# llama.cpp spec type.
KINDS: dict[str, Callable[[Mapping[str, Any]], KindPart]] = {
    "DFlashDraftModel": _dflash_part,
    "DFlash2DraftModel": _dflash2_part,
    "DSparkDraftModel": _dspark_part,
}


def serving_architecture(config: Mapping[str, Any], source: str = "config.json") -> str:
    """The serving architecture of a drafter's ``config.json``, refused unless :data:`KINDS` has it."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in KINDS:
        raise ValueError(f"{source}: architectures {archs} has no GGUF writer (known: {sorted(KINDS)})")
    return arch


# -- the target GGUF ----------------------------------------------------------------------------

@dataclass
class TargetGguf:
    """What the writer takes from the target's GGUF: its architecture, shape and vocabulary keys
    (each ``(key, value type, element type, raw value)``, strings as bytes)."""

    path: Path
    architecture: str
    num_layers: int | None
    hidden_size: int | None
    vocab_size: int
    tokenizer: list[tuple[str, Any, Any, Any]]


def _field_value(field_, vtype, gguf):
    """A reader field's value, strings as raw bytes (so a copy is byte for byte)."""
    t = gguf.GGUFValueType
    if vtype == t.STRING:
        return bytes(field_.parts[field_.data[0]])
    if vtype == t.ARRAY:
        sub = field_.types[-1]
        if sub == t.STRING:
            return [bytes(field_.parts[i]) for i in field_.data]
        return [field_.parts[i].tolist()[0] for i in field_.data]
    return field_.parts[field_.data[0]].tolist()[0]


def check_gguf(path: str | os.PathLike, what: str = "GGUF") -> Path:
    """``path`` verified against the ``.sha256`` we wrote beside it (``files.write_sidecar``), before
    our reader or llama.cpp reads it: a GGUF whose bytes changed but whose header still parses would
    serve wrong weights. A mismatch is one line naming the file; a GGUF without one (not written
    by us, or by an older version) is read as it is."""
    problem = verify_sidecar(path)
    if problem is not None:
        raise UserFacingError(f"{what} {path} {problem}; write it again (export --gguf, llama-cpp convert)")
    return Path(path)


def read_target_gguf(path: str | os.PathLike) -> TargetGguf:
    """Read the target GGUF's architecture, shape and every ``tokenizer.*`` key."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"target GGUF {path} not found (convert the target first: "
                                f"dflash-train llama-cpp convert MODEL_FOLDER target.gguf)")
    check_gguf(path, "target GGUF")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as err:  # a truncated or foreign file: one line naming it
        raise ValueError(f"{path}: not a readable GGUF file ({err})") from None
    fields = reader.fields

    def scalar(key):
        f = fields.get(key)
        return None if f is None else _field_value(f, f.types[0], gguf)

    arch = scalar("general.architecture")
    if arch is None:
        raise ValueError(f"{path}: no general.architecture key")
    arch = arch.decode()
    tokenizer = [(k, f.types[0], f.types[-1] if len(f.types) > 1 else None, _field_value(f, f.types[0], gguf))
                 for k, f in fields.items() if k.startswith("tokenizer.") and k != MASK_TOKEN_KEY]
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens: the target GGUF carries no vocabulary")
    return TargetGguf(path, arch, scalar(f"{arch}.block_count"), scalar(f"{arch}.embedding_length"),
                      len(tokens.data), tokenizer)


def check_pairing(config: Mapping[str, Any], target: TargetGguf, source: str) -> None:
    """One line naming every mismatch between the drafter's config and the target GGUF."""
    from dflash_train.llamacpp import check_target_architecture

    check_target_architecture(target.architecture, str(target.path))
    problems = []
    if target.hidden_size is not None and int(config["hidden_size"]) != target.hidden_size:
        problems.append(f"hidden_size {config['hidden_size']} != the target's {target.hidden_size}")
    if int(config["vocab_size"]) != target.vocab_size:
        problems.append(f"vocab_size {config['vocab_size']} != the target's {target.vocab_size} tokens")
    layers = config.get("num_target_layers")
    if target.num_layers is not None and layers is not None and int(layers) != target.num_layers:
        problems.append(f"num_target_layers {layers} != the target's {target.num_layers} layers")
    if problems:
        raise ValueError(f"{source} does not fit the target {target.path}: " + "; ".join(problems))


# -- writing ------------------------------------------------------------------------------------

def _tensor_type(gguf_name: str, ndim: int, dtype: str):
    """llama.cpp's converter's rule: 1-D tensors, norms and names without ``.weight`` stay float32."""
    import gguf

    t = gguf.GGMLQuantizationType
    if ndim <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return t.F32
    return {"float32": t.F32, "float16": t.F16, "bfloat16": t.BF16}[dtype]


def _tensor_data(tensor, qtype):
    """``(numpy array, raw dtype or None)`` for ``add_tensor``: float32/float16 as numpy, bf16 as the
    ``gguf`` package's quantizer packs it (round to nearest even, as the converter)."""
    import gguf
    import torch

    data = tensor.detach().to(torch.float32).contiguous().numpy()
    t = gguf.GGMLQuantizationType
    if qtype == t.F32:
        return data, None
    if qtype == t.F16:
        return data.astype(np.float16), None
    return gguf.quants.quantize(data, qtype), qtype


def _add_kv(writer, kv: KV) -> None:
    import gguf

    t = gguf.GGUFValueType
    writer.add_key_value(kv.key, kv.value, t[kv.kind], t[kv.sub] if kv.sub else None)


def _weights_dtype(config: Mapping[str, Any]) -> str:
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return name if name in _FILE_TYPES else "float32"


def write_drafter_gguf(serving_dir: str | os.PathLike, target_gguf: str | os.PathLike,
                       out: str | os.PathLike | None = None, dtype: str | None = None) -> Path:
    """Write the serving folder's drafter as a llama.cpp GGUF (default ``serving_dir/drafter.gguf``).

    ``dtype`` (float32, bfloat16, float16) defaults to the folder's weights' dtype. The file is
    written next to its destination and renamed into place, so it is complete or absent.
    """
    import gguf

    from dflash_train.export.serving import CONFIG_FILE, _read_weights, verify_export
    from dflash_train.files import read_json

    folder = Path(serving_dir)
    verify_export(folder)
    config = read_json(folder / CONFIG_FILE)
    source = str(folder / CONFIG_FILE)
    arch = serving_architecture(config, source)
    target = read_target_gguf(target_gguf)
    check_pairing(config, target, f"drafter {folder}")
    dtype = dtype or _weights_dtype(config)
    if dtype not in _FILE_TYPES:
        raise ValueError(f"GGUF dtype must be one of {sorted(_FILE_TYPES)}, got {dtype!r}")
    part = KINDS[arch](config)
    keys = common_keys(config, source) + part.keys
    weights = _read_weights(folder)
    missing = sorted(set(part.tensors) - set(weights))
    extra = sorted(set(weights) - set(part.tensors))
    if missing or extra:
        raise ValueError(f"{folder}: the {arch} GGUF entry does not match the weights "
                         f"(missing {missing[:6]}, unexpected {extra[:6]})")
    out = Path(out) if out is not None else folder / GGUF_FILE
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), ARCH)
    try:
        writer.add_type("model")
        writer.add_name(folder.name)
        for kv in keys:
            _add_kv(writer, kv)
        writer.add_file_type(_FILE_TYPES[dtype])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, vtype, sub, value in target.tokenizer:
            writer.add_key_value(key, value, vtype, sub if vtype == gguf.GGUFValueType.ARRAY else None)
        writer.add_uint32(MASK_TOKEN_KEY, int(_dflash_config(config)["mask_token_id"]))
        for ours, theirs in part.tensors.items():
            data, raw = _tensor_data(weights[ours], _tensor_type(theirs, weights[ours].dim(), dtype))
            writer.add_tensor(theirs, data, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        forget_sidecar(out)  # the old file's checksum must not outlive it
        os.replace(tmp, out)
        write_sidecar(out, "GGUF checksum", "free space or choose another folder")
    except OSError as err:
        raise OSError(f"cannot write {out}: {err.strerror or err}; free space or choose another folder") from None
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return out


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """A GGUF's keys (``tokenizer.*`` arrays as lengths) and tensors, JSON-able (for reports, tests)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    keys = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = _field_value(f, f.types[0], gguf)
        if isinstance(value, list) and len(value) > 64:
            value = f"<{len(value)} items>"
        keys[key] = value.decode(errors="replace") if isinstance(value, bytes) else value
    tensors = {t.name: {"type": t.tensor_type.name, "shape": [int(x) for x in t.shape]} for t in reader.tensors}
    return {"keys": json.loads(json.dumps(keys, default=str)), "tensors": tensors}


def spec_type(serving_dir: str | os.PathLike) -> str:
    """The ``--spec-type`` llama.cpp serves the serving folder's drafter with (its kind's entry)."""
    from dflash_train.export.serving import CONFIG_FILE
    from dflash_train.files import read_json

    config = read_json(Path(serving_dir) / CONFIG_FILE)
    return KINDS[serving_architecture(config, str(Path(serving_dir) / CONFIG_FILE))](config).spec_type
