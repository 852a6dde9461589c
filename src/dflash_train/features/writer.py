"""The feature store's writing side: its lock, per-rank indexes, shards and manifest.

``dflash-train features`` (``distributed/feature_job.py``: it runs the target, so it sits above
``train/``) uses these to run the target once over a data set and write its feature store.

Which micro-batches: those of the job's first epoch (``data:`` and ``train.seed`` plan them, as
training does), so the stored features are the ones online training computes in its first epoch, bit
for bit (``auto``); rank r of W (torchrun) takes the micro-batches that training's rank r takes
(``train.grad_accum`` at a time) and writes its own shards and index (disjoint files, no coordination
but a barrier at the end). Every conversation is written once.

Resumable: a rank's index lists the micro-batches its shards hold; a rerun skips them, removes a
shard that has no index line (killed between the rename and the line) and drops a torn last line.
``--verify`` rehashes every indexed shard first and rewrites those whose sha256 differs. A full disk
is one line (the shard being written is removed; what is indexed stays), and the rerun completes the
store. One writer per store: the run-folder lock (``run_lock.py``), on the store folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_train.features import format as fmt
from dflash_train.features.extract import target_features
from dflash_train.files import UserFacingError, atomic_write_bytes, explained
from dflash_train.run_lock import RunLock

TODO = "free space or write the store elsewhere, then rerun: the store continues where it stopped"


class StoreLock(RunLock):
    """The run-folder lock on a store folder: a second writer is refused, naming the first."""

    def _busy(self, info, by_hand: bool = False) -> str:
        return super()._busy(info, by_hand).replace("choose another train.run_dir", "write another store").replace(
            "train.run_dir", "feature store")


@dataclass
class Index:
    """A rank's index: its shards' lines, read back (a torn last line dropped)."""

    path: Path
    lines: list[dict] = field(default_factory=list)
    torn: bool = False  # its last line was cut short (killed mid-write): dropped, rewritten before appending

    @classmethod
    def read(cls, path: Path) -> Index:
        index = cls(path)
        if not path.exists():
            return index
        with explained("cannot read feature store index", path):
            text = path.read_text()
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            try:
                index.lines.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines):
                    raise UserFacingError(f"feature store index {path}: line {number} is not JSON; remove the "
                                          "store and write it again") from None
                index.torn = True
        return index

    def rewrite(self) -> None:
        atomic_write_bytes(self.path, "".join(json.dumps(line) + "\n" for line in self.lines).encode(),
                           "feature store index", TODO)

    def append(self, line: dict) -> None:
        with explained("cannot write feature store index", self.path, TODO), open(self.path, "a") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.lines.append(line)

    def done(self) -> set[int]:
        return {mb for line in self.lines for mb in line["micro_batches"]}


def my_micro_batches(count: int, rank: int, world: int, grad_accum: int) -> list[int]:
    """The first epoch's micro-batches that training's rank ``rank`` takes (``BatchIterator``)."""
    return [i for i in range(count) if (i % (grad_accum * world)) // grad_accum == rank]


def clean_rank(folder: Path, rank: int, index: Index, verify: bool, echo) -> None:
    """Keep only shards a whole index line names: drop lines whose shard is missing, short or (with
    ``verify``) hashes differently, and remove shards no line names."""
    kept = []
    for line in index.lines:
        shard = folder / line["shard"]
        size = shard.stat().st_size if shard.exists() else -1
        if size != line["bytes"] or (verify and fmt.file_sha256(shard) != line["sha256"]):
            echo(f"feature store: shard {shard} is missing or damaged; it will be written again")
            continue
        kept.append(line)
    if len(kept) != len(index.lines) or index.torn:
        index.lines, index.torn = kept, False
        index.rewrite()
    named = {line["shard"] for line in kept}
    for shard in folder.glob(f"r{rank:03d}-*.safetensors"):
        if shard.name not in named:
            shard.unlink()


class ShardWriter:
    """Collects conversations' encoded rows; ``flush`` writes them as one shard, then its index line."""

    def __init__(self, folder: Path, rank: int, index: Index, shard_bytes: int):
        self.folder, self.rank, self.index, self.shard_bytes = folder, rank, index, shard_bytes
        self.number = 1 + max((int(line["shard"][5:11]) for line in index.lines), default=-1)
        self.parts: list[dict[str, torch.Tensor]] = []
        self.samples: list[list[int]] = []
        self.micro_batches: list[int] = []
        self.rows = self.bytes = 0

    def add(self, sample: int, parts: dict[str, torch.Tensor]) -> None:
        length = parts["features"].shape[0]
        self.samples.append([sample, self.rows, length, fmt.checksum(parts)])
        self.parts.append(parts)
        self.rows += length
        self.bytes += sum(t.numel() * t.element_size() for t in parts.values())

    def end_micro_batch(self, number: int, last: bool) -> None:
        self.micro_batches.append(number)
        if self.bytes >= self.shard_bytes or (last and self.parts):
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save

        tensors = {name: torch.cat([p[name] for p in self.parts]) for name in self.parts[0]}
        name = fmt.shard_name(self.rank, self.number)
        data = save(tensors, metadata={"format": fmt.FORMAT, "version": str(fmt.VERSION)})
        atomic_write_bytes(self.folder / name, data, "feature store shard", TODO)
        self.index.append({"shard": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                           "micro_batches": self.micro_batches, "samples": self.samples})
        self.number += 1
        self.parts, self.samples, self.micro_batches, self.rows, self.bytes = [], [], [], 0, 0


def check_space(folder: Path, needed: int, echo) -> None:
    """Say how many bytes the store still needs; refuse in one line where the disk lacks them."""
    free = shutil.disk_usage(folder).free
    echo(f"feature store {folder}: {needed / 2**30:.2f} GiB still to write, {free / 2**30:.2f} GiB free")
    if needed > free:
        raise UserFacingError(f"feature store {folder}: needs {needed / 2**30:.2f} GiB more, the disk has "
                              f"{free / 2**30:.2f} GiB free; {TODO}")


def open_manifest(folder: Path, fingerprint: dict, encoding: dict, is_main: bool) -> dict:
    """The store's manifest: the one there (refused if it is another job's or another encoding's), or
    a new one in state ``writing`` (the main rank writes it)."""
    found = fmt.read_manifest(folder)
    if found is not None:
        differs = fmt.first_difference(found["job"], fingerprint)
        if differs is not None:
            raise fmt.mismatch(folder, differs, found["job"], fingerprint)
        for key, value in encoding.items():
            if found["encoding"].get(key) != value:
                raise UserFacingError(f"feature store {folder} holds {key}={found['encoding'].get(key)}, this "
                                      f"dump asks {value}: write to another folder or remove it")
        return found
    manifest = {"format": fmt.FORMAT, "version": fmt.VERSION, "state": "writing", "job": fingerprint,
                "encoding": encoding}
    if is_main:
        fmt.write_manifest(folder, manifest)
    return manifest


def store_job(cfg, target, drafter_cfg, dataset, dtype: torch.dtype, kind: str, world: int) -> tuple[dict, dict]:
    """The manifest's ``job`` (what the store must match) and ``encoding`` of job ``cfg``'s store."""
    fingerprint = fmt.job_fingerprint(cfg, target, drafter_cfg, dataset, dtype)
    layers, hidden = len(drafter_cfg.target_layer_ids), target.facts.hidden_size
    per_token = fmt.bytes_per_token(kind, dtype, layers, hidden, fingerprint["final_hidden"])
    encoding = {"dtype": kind, "stored_dtype": str(fmt.stored_dtype(kind, dtype)).removeprefix("torch."),
                "layers": layers, "bytes_per_token": per_token, "world": world,
                "grad_accum": cfg.train.grad_accum, "token_budget": cfg.data.token_budget, "pack": cfg.data.pack,
                "seed": cfg.train.seed}
    return fingerprint, encoding


def add_micro_batch(writer: ShardWriter, micro_batch, out, kind: str, layers: int) -> int:
    """Hand a micro-batch's conversations to ``writer``, encoded: ``out`` is the target's features
    (``target_features``: a tensor, or (features, final hidden states)). Returns the tokens added."""
    features, last = out if isinstance(out, tuple) else (out, None)
    flat = features.reshape(-1, features.shape[-1])
    flat_last = None if last is None else last.reshape(-1, last.shape[-1])
    tokens = 0
    for sample, start, length in fmt.conversation_spans(micro_batch):
        rows = slice(start, start + length)
        writer.add(sample, fmt.encode(flat[rows], None if flat_last is None else flat_last[rows], kind, layers))
        tokens += length
    return tokens


def write_missing(target, layer_ids: list[int], final: bool, batches, plan: list, todo: list[int],
                  writer: ShardWriter, kind: str, layers: int, device: torch.device) -> int:
    """Run the target over the first epoch's micro-batches ``todo`` and write them; returns the tokens."""
    tokens = 0
    for n, i in enumerate(todo):
        mb = batches.collate(plan[i], 0)
        out = target_features(target, layer_ids, final, mb, mb.input_ids.to(device), mb.attention_mask.to(device))
        tokens += add_micro_batch(writer, mb, out, kind, layers)
        writer.end_micro_batch(i, n == len(todo) - 1)
    return tokens


def finish(folder: Path, manifest: dict, examples: int, tokens_per_s: float | None) -> dict:
    """Check that every conversation is in some shard and mark the store complete, with its size."""
    lines = [line for path in sorted(folder.glob("index-r*.jsonl")) for line in Index.read(path).lines]
    seen = {s[0] for line in lines for s in line["samples"]}
    if len(seen) != examples:
        raise UserFacingError(f"feature store {folder}: {examples - len(seen)} of {examples} conversations "
                              "are in no shard (a rank did not finish); rerun the same command")
    manifest = {**manifest, "state": "complete", "shards": len(lines),
                "tokens": sum(s[2] for line in lines for s in line["samples"]),
                "bytes": sum(line["bytes"] for line in lines)}
    if tokens_per_s is not None:
        manifest["dump_tokens_per_s_rank0"] = round(tokens_per_s, 1)
    fmt.write_manifest(folder, manifest)
    return manifest

