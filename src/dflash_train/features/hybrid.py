"""The hybrid mode (``train.feature_cache=disk``): online in the first epoch while writing the feature
store ``train.feature_store`` names, then every later epoch from that store.

Why: the in-memory cache (``feature_cache=device|cpu``) must fit in memory and dies with the process;
a dumped store (``dflash-train features``) costs a pass of the target before training starts. The hybrid
pays neither: the first epoch's target forward, which training needs anyway, is what gets stored, and the
store outlives the run (the next ablation, drafter kind or resumed run reads it with
``train.feature_store=PATH``).

It is the same store ``dflash-train features`` writes (same shards, index, manifest and checks): the
first epoch's micro-batches are the ones the dump plans, each written once under its number in the first
epoch's plan. At the first step whose micro-batches are all of a later epoch (the same step on every
rank: ``step_first_epoch``), each rank flushes its last shard and runs the target over what its part of
the first epoch did not write (a run resumed mid-epoch lost the unflushed shard of the run it continues),
the ranks meet, the main rank marks the store complete, and from then on every rank reads it
(``reader.StoreFeatures``, prefetched). With ``feature_store_dtype=auto`` the store holds exactly the
features online training computes, so the run's losses equal online training's step for step.

Costs: the first epoch copies each micro-batch's features to the host (one device-to-host copy per
micro-batch: that epoch waits on it) and writes them; the target stays loaded (held-out evaluation
during training still decodes with it). A run that ends inside the first epoch leaves a store that
``dflash-train features`` (same job) or the next hybrid run completes. Given a complete store, the
run reads it from the first step.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from dflash_train.features import format as fmt
from dflash_train.features.reader import FeatureStore, StoreFeatures
from dflash_train.features.writer import (
    Index,
    ShardWriter,
    StoreLock,
    add_micro_batch,
    clean_rank,
    finish,
    my_micro_batches,
    open_manifest,
    store_job,
    write_missing,
)
from dflash_train.files import explained

SHARD_MIB = 256.0  # as `dflash-train features`' default


def first_sample(entry) -> int:
    """The first conversation of a plan entry (ids, or packed rows of ids): one per micro-batch of an epoch."""
    first = entry[0]
    return first[0] if isinstance(first, list) else first


class HybridFeatures:
    """The trainer's feature source for ``train.feature_cache=disk`` (see the module docstring)."""

    summary_key = "feature_store"

    def __init__(self, trainer, online, kind: str):
        cfg = trainer.cfg
        self.trainer, self.online, self.kind = trainer, online, kind
        self.folder = Path(cfg.train.feature_store)
        self.rank, self.world = trainer.ranks.rank, trainer.ranks.world
        self.fingerprint, encoding = store_job(cfg, trainer.target, trainer.drafter_cfg, trainer.dataset,
                                               trainer.dtype, kind, self.world)
        self.layers = encoding["layers"]
        with explained("cannot write feature store", self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)
        self.lock = StoreLock(self.folder, trainer.echo) if trainer.ranks.is_main else None
        if self.lock is not None:
            self.lock.acquire()
        self.manifest = open_manifest(self.folder, self.fingerprint, encoding, trainer.ranks.is_main)
        self.reader: StoreFeatures | None = None
        self.written_tokens, self.write_seconds, self.completed_tokens = 0, 0.0, 0
        self.plan = trainer.plan.epoch_micro_batches(0)
        if self.manifest["state"] == "complete":
            trainer.echo(f"feature store {self.folder}: complete already; every epoch reads it")
            self._open_reader()
            return
        self.index = Index.read(self.folder / fmt.index_name(self.rank))
        clean_rank(self.folder, self.rank, self.index, False, trainer.echo)
        self.writer = ShardWriter(self.folder, self.rank, self.index, int(SHARD_MIB * 2**20))
        self.number_of = {first_sample(entry): i for i, entry in enumerate(self.plan)}
        self.written = self.index.done()
        trainer.echo(f"feature store {self.folder}: the first epoch writes it ({kind}, {encoding['bytes_per_token']} "
                     f"bytes/token, {len(self.written)} of {len(self.plan)} micro-batches there already); later "
                     "epochs read it")

    # -- the trainer's source interface ------------------------------------------------------------------------
    def next_step(self):
        return self.online.next_step()

    def prefetch(self, micro_batch) -> None:
        if self.reader is not None:  # before the switch a later epoch's rows are read in the step
            self.reader.prefetch(micro_batch)

    def features(self, micro_batch, input_ids, attention_mask):
        if self.reader is None and micro_batch.host.get("step_first_epoch", micro_batch.epoch) >= 1:
            self._complete()
        if self.reader is not None:
            return self.reader.features(micro_batch, input_ids, attention_mask)
        out = self.online.features(micro_batch, input_ids, attention_mask)
        if micro_batch.epoch == 0:
            self._write(micro_batch, out)
        return out

    def finish(self) -> None:
        """The run's end: a store left incomplete keeps every micro-batch it was given (a rerun completes it)."""
        if self.reader is None and self.writer.parts:
            self.writer.flush()
        if self.reader is not None:
            self.reader.finish()
        self._release()
        self.online.finish()

    # -- writing -------------------------------------------------------------------------------------------------
    def _write(self, micro_batch, out) -> None:
        number = self.number_of[int(micro_batch.sample_ids[0])]
        if number in self.written:  # written by the run this one resumes
            return
        started = time.perf_counter()
        self.written_tokens += add_micro_batch(self.writer, micro_batch, out, self.kind, self.layers)
        self.writer.end_micro_batch(number, last=False)
        self.written.add(number)
        self.write_seconds += time.perf_counter() - started

    def _complete(self) -> None:
        """The first epoch is over on every rank: write what it left out, mark the store complete, read it."""
        trainer = self.trainer
        trainer.ranks.expect_long("completing the feature store")
        if self.writer.parts:
            self.writer.flush()
        mine = my_micro_batches(len(self.plan), self.rank, self.world, trainer.cfg.train.grad_accum)
        todo = [i for i in mine if i not in self.index.done()]
        if todo:
            trainer.echo(f"feature store {self.folder}: writing the {len(todo)} first-epoch micro-batches it lacks")
            self.completed_tokens = write_missing(
                trainer.target, trainer.drafter_cfg.target_layer_ids, self.fingerprint["final_hidden"],
                trainer.data.batches(0, 1, 1), self.plan, todo, self.writer, self.kind, self.layers, trainer.device)
        self._barrier()
        if trainer.ranks.is_main:
            self.manifest = finish(self.folder, self.manifest, len(trainer.dataset), None)
            trainer.echo(f"feature store {self.folder}: complete, {self.manifest['tokens']:,} tokens, "
                         f"{self.manifest['bytes'] / 2**30:.3f} GiB; later epochs read it")
        self._barrier()
        self._release()
        self._open_reader()

    def _open_reader(self) -> None:
        trainer = self.trainer
        store = FeatureStore(self.folder)
        store.check(self.fingerprint)
        self.reader = StoreFeatures(trainer.batches, store, trainer.device, trainer.dtype,
                                    trainer.opts.needs_target_distribution)

    def _barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier(group=self.trainer.ranks.group)

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # -- reporting -----------------------------------------------------------------------------------------------
    def report(self) -> dict:
        """What the first epoch wrote (tokens, the seconds the step spent encoding and writing), what the
        switch completed, and the reads after it (``StoreFeatures.report``)."""
        out = {"mode": "hybrid", "store": str(self.folder), "written_tokens": self.written_tokens,
               "write_seconds": round(self.write_seconds, 3), "completed_tokens": self.completed_tokens,
               "complete": self.reader is not None}
        if self.reader is not None:
            out.update(self.reader.report())
        return out

    def report_line(self, report: dict) -> str:
        line = (f"feature store (hybrid): the first epoch wrote {report['written_tokens']:,} tokens "
                f"({report['write_seconds']:.1f} s in the steps)")
        if not report["complete"]:
            return line + "; the store is incomplete: the next hybrid run or dflash-train features completes it"
        return line + "; " + self.reader.report_line(report)


def hybrid_source(trainer, online) -> HybridFeatures:
    """The trainer's source for ``train.feature_cache=disk``: ``online`` in the first epoch, then the store."""
    return HybridFeatures(trainer, online, trainer.cfg.train.feature_store_dtype)
