"""Training from a feature store (``train.feature_store=PATH``): the features of each micro-batch read
from disk instead of a target forward.

``FeatureStore`` opens a complete store, checks it against the job (``format.MATCHED``: the first field
that differs is the error) and reads one conversation's rows, verifying their CRC-32 on every read.
``StoreFeatures`` is the trainer's feature source (``train/features.py`` says what a source is): the
prefetching thread (``data/prefetch.py``, ``data.prefetch_steps`` ahead) gathers a micro-batch's rows
into one host buffer (pinned on CUDA) in the store's encoding; the step copies it to the device
asynchronously and decodes it there (an FP8 store crosses PCIe at half the bytes). So the step waits
on the disk only when the disk is slower than the step: ``report`` gives the bytes read, the seconds
the reads took and the seconds the step waited for them. Reads are per conversation, so any later
epoch's packing and any rank's shard of the data read the same rows; with W ranks, rank r's first
epoch reads exactly the shards rank r wrote.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from dflash_train.features import format as fmt
from dflash_train.files import UserFacingError


class FeatureStore:
    """A complete store, addressed by dataset index."""

    def __init__(self, path: str | Path, max_open: int = 64):
        self.path = Path(path)
        manifest = fmt.read_manifest(self.path)
        if manifest is None:
            raise UserFacingError(f"train.feature_store {self.path}: no feature store there (no {fmt.MANIFEST}); "
                                  "write one with dflash-train features")
        if manifest["state"] != "complete":
            raise UserFacingError(f"train.feature_store {self.path}: the store is still being written (or its "
                                  "writer stopped); rerun dflash-train features to complete it")
        from dflash_train.features.writer import Index

        self.manifest, self.job, self.encoding = manifest, manifest["job"], manifest["encoding"]
        self.layers = self.encoding["layers"]
        examples = self.job["examples"]
        self.shard_of = np.full(examples, -1, dtype=np.int64)
        self.row_of, self.length_of = np.zeros(examples, np.int64), np.zeros(examples, np.int64)
        self.crc_of = np.zeros(examples, np.int64)
        self.shards: list[tuple[str, int]] = []
        for index in sorted(self.path.glob("index-r*.jsonl")):
            for line in Index.read(index).lines:
                self._add(line)
        self.open: OrderedDict[int, object] = OrderedDict()
        self.max_open = max_open

    def _add(self, line: dict) -> None:
        number = len(self.shards)
        self.shards.append((line["shard"], line["bytes"]))
        for sample, row, length, crc in line["samples"]:
            self.shard_of[sample], self.row_of[sample], self.length_of[sample] = number, row, length
            self.crc_of[sample] = crc

    def check(self, fingerprint: dict) -> None:
        """Refuse a job this store was not written for, naming the first field that differs; and a job
        with an objective.targets kl/tv term when the store has no final hidden states."""
        differs = fmt.first_difference(self.job, fingerprint)
        if differs is not None:
            raise fmt.mismatch(self.path, differs, self.job, fingerprint)
        if fingerprint["final_hidden"] and not self.job["final_hidden"]:
            raise UserFacingError(f"train.feature_store {self.path} holds no final hidden states, which "
                                  "objective.targets kl/tv need; write the store with this job's objective")

    # -- reading -------------------------------------------------------------------------------------------
    def _shard(self, number: int):
        """An open shard (memory-mapped; at most ``max_open`` at once), its size checked at opening."""
        if number in self.open:
            self.open.move_to_end(number)
            return self.open[number]
        from safetensors import safe_open

        name, size = self.shards[number]
        file = self.path / name
        found = file.stat().st_size if file.exists() else None
        if found != size:
            what = "is missing" if found is None else f"has {found} bytes, its index says {size} (truncated?)"
            raise UserFacingError(f"feature store shard {file} {what}; rerun dflash-train features with --verify "
                                  "to rewrite it")
        try:
            handle = safe_open(str(file), framework="pt")
        except Exception as err:  # safetensors raises its own error types
            raise UserFacingError(f"feature store shard {file}: unreadable ({str(err).splitlines()[0]}); rerun "
                                  "dflash-train features with --verify to rewrite it") from None
        self.open[number] = handle
        if len(self.open) > self.max_open:
            self.open.popitem(last=False)
        return handle

    def read(self, sample: int) -> dict[str, torch.Tensor]:
        """Conversation ``sample``'s stored tensors (``format.encode``), CRC-checked."""
        number = int(self.shard_of[sample]) if 0 <= sample < len(self.shard_of) else -1
        if number < 0:
            raise UserFacingError(f"feature store {self.path}: conversation {sample} is in no shard")
        handle, row, length = self._shard(number), int(self.row_of[sample]), int(self.length_of[sample])
        try:
            parts = {name: handle.get_slice(name)[row:row + length] for name in handle.keys()}  # noqa: SIM118 (not iterable)
        except Exception as err:
            raise self._damaged(number, sample, str(err).splitlines()[0]) from None
        if fmt.checksum(parts) != int(self.crc_of[sample]):
            raise self._damaged(number, sample, "its bytes do not match their CRC-32")
        return parts

    def _damaged(self, number: int, sample: int, why: str) -> UserFacingError:
        return UserFacingError(f"feature store shard {self.path / self.shards[number][0]}: conversation {sample} "
                               f"is damaged ({why}); rerun dflash-train features with --verify to rewrite it")

    def close(self) -> None:
        self.open.clear()


class StoreFeatures:
    """The trainer's feature source reading a ``FeatureStore`` (see the module docstring)."""

    summary_key = "feature_store"

    def __init__(self, batches, store: FeatureStore, device: torch.device, dtype: torch.dtype, final_hidden: bool):
        self.batches, self.store, self.device, self.dtype = batches, store, torch.device(device), dtype
        self.final_hidden = final_hidden
        self.pin = self.device.type == "cuda"
        self.read_bytes, self.read_seconds, self.waited_seconds, self.waits, self.steps = 0, 0.0, 0.0, 0, 0
        self.first_call = self.last_call = None  # the span of the steps' calls: the bandwidth they consumed

    def next_step(self):
        return self.batches.next_step()

    def finish(self) -> None:
        self.store.close()

    def prefetch(self, micro_batch) -> None:
        """The prefetching thread: read the micro-batch's rows now."""
        micro_batch.host["store_rows"] = self._gather(micro_batch)

    def _gather(self, micro_batch) -> dict[str, torch.Tensor]:
        """The micro-batch's stored tensors, [rows * seq, ...] with zeros on padding, on the host."""
        started = time.perf_counter()
        slots = micro_batch.input_ids.numel()
        out: dict[str, torch.Tensor] = {}
        for sample, start, length in fmt.conversation_spans(micro_batch):
            parts = self.store.read(sample)
            if parts["features"].shape[0] != length:
                raise UserFacingError(f"feature store {self.store.path}: conversation {sample} has "
                                      f"{parts['features'].shape[0]} rows, the data has {length} tokens")
            for name, rows in parts.items():
                if name not in out:
                    out[name] = torch.zeros(slots, *rows.shape[1:], dtype=rows.dtype, pin_memory=self.pin)
                out[name][start:start + length] = rows
        self.read_bytes += sum(t.numel() * t.element_size() for t in out.values())
        self.read_seconds += time.perf_counter() - started
        return out

    def features(self, micro_batch, input_ids, attention_mask):
        host = micro_batch.host.pop("store_rows", None)
        if host is None:  # not read ahead (data.prefetch_steps=0): the step waits for the disk
            started = time.perf_counter()
            host = self._gather(micro_batch)
            self.waited_seconds += time.perf_counter() - started
            self.waits += 1
        self.steps += 1
        self.last_call = time.perf_counter()
        self.first_call = self.first_call or self.last_call
        shape = input_ids.shape
        parts = {name: t.to(self.device, non_blocking=self.pin) for name, t in host.items()}
        features = fmt.decode(parts, self.dtype, self.store.layers).view(*shape, -1)
        if not self.final_hidden:
            return features
        return features, parts["final"].to(self.dtype).view(*shape, -1)

    def report(self) -> dict:
        """Bytes read from the store, the seconds the reads took (on the prefetching thread unless
        ``read_in_step``), the bandwidth the reads reached, the bandwidth the steps consumed (bytes over
        the time from the first step's read to the last's: the store keeps up while this is below the
        former), and the seconds the step itself waited on reads."""
        gib = self.read_bytes / 2**30
        span = (self.last_call - self.first_call) if self.first_call is not None else 0.0
        return {"read_gib": round(gib, 4), "read_seconds": round(self.read_seconds, 3),
                "read_gib_per_s": round(gib / self.read_seconds, 3) if self.read_seconds else None,
                "steps_gib_per_s": round(gib / span, 4) if span else None,
                "step_waited_seconds": round(self.waited_seconds, 3), "micro_batches": self.steps,
                "read_in_step": self.waits}

    def report_line(self, report: dict) -> str:
        return (f"feature store: {report['read_gib']:.3f} GiB read in {report['read_seconds']:.1f} s "
                f"({report['read_gib_per_s']} GiB/s; the steps consumed {report['steps_gib_per_s']} GiB/s), "
                f"the step waited {report['step_waited_seconds']:.1f} s")


def store_source(trainer) -> StoreFeatures:
    """The trainer's source for ``train.feature_store``: the store opened and checked against its job."""
    store = FeatureStore(trainer.cfg.train.feature_store)
    store.check(fmt.job_fingerprint(trainer.cfg, trainer.target, trainer.drafter_cfg, trainer.dataset,
                                    trainer.dtype))
    trainer.echo(f"feature store {store.path}: {store.job['tokens']:,} tokens, encoding "
                 f"{store.encoding['dtype']} ({store.encoding['bytes_per_token']} bytes/token); no target forward")
    return StoreFeatures(trainer.batches, store, trainer.device, trainer.dtype, trainer.opts.needs_target_distribution)
