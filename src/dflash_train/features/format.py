"""The feature store's on-disk format (docs/spec.md section 6): names, encodings, checksums, manifest.

A store is a folder::

    manifest.json                 what produced it (``job_fingerprint``), its encoding, state and size
    index-r000.jsonl              rank 0's shards, one JSON line per shard, appended after the shard is in place
    r000-000000.safetensors       rank 0's first shard: the rows of whole conversations
    ...

A shard holds ``features`` [T, n*h] (T tokens of whole conversations, one after another), in the
store's dtype: the target's own (``auto``: bitwise what online training sees), ``bfloat16``, or
``float8`` (e4m3 with one float32 scale per token and target layer, ``scales`` [T, n]); and, when an
``objective.targets`` kl/tv term needs the target's distribution, ``final`` [T, h] (the final-normed
last hidden state, never quantized). Its index line lists its conversations (dataset index, first row,
length, CRC-32 of their bytes) and the shard's sha256: a reader checks a conversation's CRC each time
it reads it, so a flipped bit or a short file names the shard and the conversation, and is never
trained on. The shard is renamed into place before its index line is written, so a line always names a
whole shard; a shard with no line (killed between the two) is rewritten by the rerun.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import asdict
from pathlib import Path

import torch

from dflash_train.files import UserFacingError, atomic_write_text, read_text

FORMAT = "dflash-feature-store"
VERSION = 1
MANIFEST = "manifest.json"
DTYPES = ("auto", "bfloat16", "float8")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value

# the fields that decide a store's features: a job that differs in one is refused, naming it
MATCHED = ("target_config", "target_files", "target_dtype", "target_head", "layer_ids", "tokenizer",
           "chat_template", "max_length", "data_files", "dataset")


def index_name(rank: int) -> str:
    return f"index-r{rank:03d}.jsonl"


def shard_name(rank: int, number: int) -> str:
    return f"r{rank:03d}-{number:06d}.safetensors"


# -- encodings ----------------------------------------------------------------------------------------
def stored_dtype(kind: str, target_dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``features`` in a store of encoding ``kind`` (``DTYPES``)."""
    return {"auto": target_dtype, "bfloat16": torch.bfloat16, "float8": FP8}[kind]


def final_dtype(kind: str, target_dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``final``: the target's for ``auto``, bfloat16 otherwise (never FP8: it becomes logits)."""
    return target_dtype if kind == "auto" else torch.bfloat16


def bytes_per_token(kind: str, target_dtype: torch.dtype, layers: int, hidden: int, final: bool) -> int:
    """Bytes one token takes in a store (shard headers aside)."""
    size = layers * hidden * stored_dtype(kind, target_dtype).itemsize
    if kind == "float8":
        size += 4 * layers  # one float32 scale per token and layer
    if final:
        size += hidden * final_dtype(kind, target_dtype).itemsize
    return size


def encode(features: torch.Tensor, final: torch.Tensor | None, kind: str, layers: int) -> dict[str, torch.Tensor]:
    """A conversation's rows [T, n*h] (and final states [T, h]) as the store keeps them, on the CPU.
    ``float8``: each token's slice of each layer is scaled so its largest magnitude is e4m3's largest
    value (per-row scaling, as torchao's rowwise recipe and speculators' FP8 store)."""
    out = {}
    if kind == "float8":
        rows = features.float().reshape(features.shape[0], layers, -1)
        scales = (rows.abs().amax(-1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        out["features"] = (rows / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).reshape(features.shape)
        out["scales"] = scales
    else:
        out["features"] = features.to(stored_dtype(kind, features.dtype))
    if final is not None:
        out["final"] = final.to(final_dtype(kind, final.dtype))
    return {name: t.detach().to("cpu").contiguous() for name, t in out.items()}


def decode(parts: dict[str, torch.Tensor], dtype: torch.dtype, layers: int) -> torch.Tensor:
    """Features [..., n*h] in ``dtype`` from a store's ``features`` (and ``scales``), on their device."""
    features = parts["features"]
    if "scales" not in parts:
        return features.to(dtype)
    shape = features.shape
    rows = features.float().reshape(*shape[:-1], layers, -1) * parts["scales"][..., None]
    return rows.reshape(shape).to(dtype)


def checksum(parts: dict[str, torch.Tensor]) -> int:
    """CRC-32 of a conversation's bytes, tensor by tensor in name order (zlib: fast, no GIL)."""
    crc = 0
    for name in sorted(parts):
        crc = zlib.crc32(parts[name].contiguous().view(torch.uint8).numpy(), crc)
    return crc


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# -- the fingerprint of a job -------------------------------------------------------------------------------
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tensor_sha(h, tensor: torch.Tensor) -> None:
    h.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy())


def head_fingerprint(target) -> str:
    """sha256 of what a store-trained drafter reads of the target: embedding, final norm, lm_head."""
    h = hashlib.sha256()
    _tensor_sha(h, target.embed_tokens.weight)
    if target.final_norm is not None and getattr(target.final_norm, "weight", None) is not None:
        _tensor_sha(h, target.final_norm.weight)
    _tensor_sha(h, target.lm_head_weight)
    return h.hexdigest()


def weight_files(path: str | None) -> list[list]:
    """[name, bytes] of the target folder's weight files (hashing 16 GB of an 8B target at every start
    would cost a minute: their names and sizes, with the head's hash and the config, identify it)."""
    folder = Path(path) if path else None
    if folder is None or not folder.exists():
        return []
    folder = folder.parent if folder.is_file() else folder
    return sorted([p.name, p.stat().st_size] for p in folder.iterdir()
                  if p.suffix in (".safetensors", ".bin", ".gguf", ".pt"))


def dataset_fingerprint(dataset) -> str:
    """sha256 of the tokenized conversations (tokens and loss masks, in order): the store's rows are
    addressed by dataset index, so the job's data must tokenize to exactly these."""
    import numpy as np

    h = hashlib.sha256()
    for batch in dataset.with_format("arrow").iter(batch_size=4096):
        for column in ("input_ids", "loss_mask"):
            values = batch[column].combine_chunks()
            h.update(np.asarray(values.value_lengths()).tobytes())
            h.update(np.asarray(values.flatten()).tobytes())
    return h.hexdigest()


def data_files(paths) -> list[list[str]]:
    """[name, sha256] of every data file the job reads (folders hashed whole); the name without its
    folder: the same files moved elsewhere are the same data."""
    from dflash_train.data.cache import _hash_path
    from dflash_train.data.readers import resolve_files

    out = []
    for f in resolve_files(paths):
        h = hashlib.sha256()
        _hash_path(h, Path(f))
        out.append([Path(f).name, h.hexdigest()])
    return out


def job_fingerprint(cfg, target, drafter_cfg, dataset, dtype: torch.dtype) -> dict:
    """What decides a store's features, for job ``cfg`` (``MATCHED``), and facts about its data."""
    from dflash_train.data.cache import tokenizer_fingerprint

    tokenizer = target.tokenizer
    facts = json.dumps({"model_type": getattr(target.model.config, "model_type", None), **asdict(target.facts)},
                       sort_keys=True)
    return {
        "target_path": str(cfg.target.path),
        "target_config": _sha(facts.encode()),
        "target_files": weight_files(cfg.target.path),
        "target_dtype": str(dtype).removeprefix("torch."),
        "target_head": head_fingerprint(target),
        "layer_ids": list(drafter_cfg.target_layer_ids),
        "hidden_size": target.facts.hidden_size,
        "final_hidden": bool(cfg.objective.needs_target_distribution),
        "tokenizer": tokenizer_fingerprint(tokenizer) if tokenizer is not None else None,
        "chat_template": _sha(str(getattr(tokenizer, "chat_template", None)).encode()),
        "max_length": cfg.data.max_length,
        "data_paths": [str(p) for p in cfg.data.paths],
        "data_files": data_files(cfg.data.paths),
        "dataset": dataset_fingerprint(dataset),
        "examples": len(dataset),
        "tokens": int(sum(dataset["length"])),
    }


def first_difference(store: dict, job: dict) -> str | None:
    """The first ``MATCHED`` field in which ``store``'s fingerprint and ``job``'s differ, or None."""
    return next((name for name in MATCHED if store.get(name) != job.get(name)), None)


def mismatch(path: Path, field: str, store: dict, job: dict) -> UserFacingError:
    def short(value) -> str:
        text = json.dumps(value)
        return text if len(text) <= 80 else text[:77] + "..."

    return UserFacingError(f"feature store {path} was written for another job: {field} differs (store "
                           f"{short(store.get(field))}, this job {short(job.get(field))}); write a store for "
                           f"this job (dflash-train features) or use the job that wrote it")


# -- the manifest -----------------------------------------------------------------------------------------
def read_manifest(path: Path) -> dict | None:
    """The store's manifest, None where there is none; one line where it does not read."""
    file = Path(path) / MANIFEST
    if not file.exists():
        return None
    try:
        manifest = json.loads(read_text(file, "feature store manifest"))
    except json.JSONDecodeError as err:
        raise UserFacingError(f"feature store manifest {file}: not JSON ({err.msg} at line {err.lineno}); "
                              "remove the store and write it again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserFacingError(f"feature store manifest {file}: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise UserFacingError(f"feature store {path}: format version {manifest.get('version')}, this code reads "
                              f"{VERSION}; write it again with this version")
    return manifest


def write_manifest(path: Path, manifest: dict) -> None:
    atomic_write_text(Path(path) / MANIFEST, json.dumps(manifest, indent=1), "feature store manifest",
                      "free space or write the store elsewhere")


def conversation_spans(micro_batch) -> list[tuple[int, int, int]]:
    """(dataset index, first slot in the flattened [rows * seq], length) of each conversation of a
    micro-batch, packed or not: where its features sit in the target's output."""
    docs = micro_batch.doc_ids
    if docs is None:
        docs = torch.where(micro_batch.attention_mask.bool(), micro_batch.sample_ids[:, None], -1)
    flat = docs.flatten()
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1]
    starts[:: docs.shape[1]] = True  # a row's first token starts a conversation
    starts &= flat >= 0
    first = starts.nonzero().squeeze(1).tolist()
    ends = first[1:] + [flat.numel()]
    spans = []
    for start, end in zip(first, ends):
        sample = int(flat[start])
        length = int((flat[start:end] == sample).sum())
        spans.append((sample, start, length))
    return spans
