"""Where a trainer's micro-batches and their context features come from.

A feature source has three methods:

* ``next_step()``: the micro-batches of this rank's next optimizer step (from the trainer's
  own iterator, whose position a checkpoint records);
* ``features(micro_batch, input_ids, attention_mask)``: their target features, [rows, s, n*h]
  (with an ``objective.targets`` kl/tv term, only ``LocalFeatures``: a pair, the features and the target's
  final hidden states [rows, s, h]);
* ``finish()``: nothing more will be asked (a disaggregated drafter tells its target ranks).

``LocalFeatures`` runs the local target (one process, colocated ranks). The disaggregated
topology passes ``distributed.disagg.FeatureReceiver`` (features computed on target ranks);
``TimedFeatures`` times any source's forward into the run's ``Timings``;
``SampleFeatureCache`` (``train.feature_cache``) keeps each conversation's features after its
first epoch, so later epochs skip the target. The trainer takes
the source as an argument (a factory of the trainer, since the source reads its iterator).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_train.features.extract import target_features
from dflash_train.models.attention import document_layout
from dflash_train.train.cuda_graphs import GraphedCall


def replays_target_forward(cuda_graphs: bool, fsdp_target: bool, device: torch.device) -> bool:
    """Whether ``LocalFeatures`` replays the target's packed forward as a CUDA graph
    (``train.cuda_graphs``): on CUDA, and not for a target sharded with FSDP2 (``train.fsdp_target``),
    whose forward gathers parameters into storage that changes between calls: a replay would read
    stale memory."""
    return cuda_graphs and device.type == "cuda" and not fsdp_target


class LocalFeatures:
    """The local target's features. Packed micro-batches (one shape per run) replay its forward
    as a CUDA graph where the trainer says so (``trainer.graph_target_forward``, from
    ``replays_target_forward``; ``train/cuda_graphs.py`` says why). ``capture`` replaces the CUDA
    capture (tests)."""

    def __init__(self, trainer, capture=None):
        self.batches = trainer.batches
        self.target = trainer.target
        self.layer_ids = trainer.drafter_cfg.target_layer_ids
        self.final_hidden = trainer.opts.needs_target_distribution
        self.graphed = None
        if capture is not None or trainer.graph_target_forward:
            self.graphed = GraphedCall(self._packed, "target forward", capture=capture)

    def next_step(self):
        return self.batches.next_step()

    def _packed(self, input_ids, doc_ids):
        return self.target.features(input_ids, None, self.layer_ids, doc_ids, final_hidden=self.final_hidden)

    def features(self, micro_batch, input_ids, attention_mask):
        if micro_batch.doc_ids is not None and self.graphed is not None:
            return self.graphed(input_ids, micro_batch.doc_ids.to(input_ids.device, non_blocking=True))
        return target_features(self.target, self.layer_ids, self.final_hidden, micro_batch, input_ids, attention_mask)

    def finish(self) -> None:
        pass


class TimedFeatures:
    """A source whose ``features`` calls are timed as ``target_forward``."""

    def __init__(self, source, timings):
        self.source, self.timings = source, timings

    def next_step(self):
        return self.source.next_step()

    def features(self, micro_batch, input_ids, attention_mask):
        with self.timings.measure("target_forward"):
            return self.source.features(micro_batch, input_ids, attention_mask)

    def finish(self) -> None:
        self.source.finish()


class CachedFeatures:
    """Computes each micro-batch's features once and serves them again (the planner times
    the target and the drafter separately on the same micro-batches)."""

    def __init__(self, source):
        self.source = source
        self.cache: dict[int, torch.Tensor] = {}

    def next_step(self):
        return self.source.next_step()

    def features(self, micro_batch, input_ids, attention_mask) -> torch.Tensor:
        key = id(micro_batch)
        if key not in self.cache:
            self.cache[key] = self.source.features(micro_batch, input_ids, attention_mask)
        return self.cache[key]

    def finish(self) -> None:
        self.source.finish()


@dataclass
class CacheLayout:
    """Where a micro-batch's real tokens sit: in the flattened [rows * seq] features (``slots``)
    and in the cache (``rows``), split into the part on the cache's device and the part spilled
    to host memory. All on the host, computed once per micro-batch."""

    samples: torch.Tensor  # conversation ids present
    slots: torch.Tensor  # tokens whose features live in the device store
    rows: torch.Tensor  # ... and their rows there
    spill_slots: torch.Tensor  # tokens whose features live in host memory
    spill_rows: torch.Tensor  # ... and their rows there


# The room a training step needs beside the cache when ``train.feature_cache_gib`` is null: this fraction
# of the card, at least CACHE_HEADROOM_MIN_GIB. The SmolLM2 recipe ran with 124 GiB cached on a 141 GiB
# H200, 17 GiB (12%) left to the step; the same rule leaves an H100 80GB ~69 GiB of cache.
CACHE_HEADROOM_FRACTION = 0.12
CACHE_HEADROOM_MIN_GIB = 8.0


def cache_gib_for(free_bytes: int, total_bytes: int) -> float:
    """GiB of feature cache a GPU with ``free_bytes`` free of ``total_bytes`` can hold and still run
    the step: what is free less the headroom (CACHE_HEADROOM_FRACTION of the card, at least
    CACHE_HEADROOM_MIN_GIB); never below 0 (then every row spills to host memory)."""
    headroom = max(CACHE_HEADROOM_MIN_GIB * 2**30, CACHE_HEADROOM_FRACTION * total_bytes)
    return max(0.0, (free_bytes - headroom) / 2**30)


def free_device_gib(device: torch.device) -> float | None:
    """The default GPU part of the cache (``train.feature_cache_gib: null``), sized from the card it
    lands on, measured after the target and drafter are loaded; None (no cap) off CUDA."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return cache_gib_for(free, total)


class SampleFeatureCache:
    """Each conversation's target features, computed in its first epoch and read back from
    memory afterwards: from the second epoch on a step runs no target forward.

    Why it is exact: the frozen target gives a conversation the same features whatever row
    it is packed into (positions restart at 0 and attention stays inside it:
    ``Target.features``), so features can be stored per conversation and token and
    reassembled for any packing of any later epoch. Padding positions come back as zeros;
    no drafter query sees them (the DFlash mask keeps every block inside its own
    conversation's context).

    Why it pays: for the SmolLM2 recipe the target forward is about a third of a step (README
    "Several GPUs": 52.8 of 156 ms) and a 6-minute run reads its data five times.

    Cost: one row of ``n*h`` features per dataset token in the target's dtype, allocated up
    front on ``device`` ("cuda": the training GPU, fastest; "cpu": host memory, a gather and a
    copy per step); 57,652 SmolLM2 conversations with 4 feature layers need ~61 GB.

    A dataset larger than the GPU can hold: ``device_gib`` caps the part on ``device`` (the
    dataset's first tokens; None on a GPU: its free memory less a headroom for the step,
    ``cache_gib_for``); the rest spills to host memory. A step reads its spilled rows with
    one host gather into pinned memory and one asynchronous copy, both done ahead by the
    prefetching thread where it can (``prefetch``): the GPU keeps the step it is running.

    Indices are built on the host from the micro-batch (no device synchronization); the cache is
    not checkpointed (a resumed run refills it in its first epoch). With several colocated ranks
    each rank holds rows for the whole dataset but sees a different shard every epoch, so it
    hits only conversations it has met before: the cache pays most in one process.
    """

    def __init__(self, source, lengths, width: int, dtype: torch.dtype, device, device_gib: float | None = None):
        self.source = source
        lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
        self.offsets[1:] = lengths.cumsum(0)
        total = int(self.offsets[-1])
        row_bytes = width * torch.empty((), dtype=dtype).element_size()
        device = torch.device(device)
        if device_gib is None:
            device_gib = free_device_gib(device)
        on_device = total if device_gib is None else min(total, int(device_gib * 2**30) // row_bytes)
        self.store = self._allocate(on_device, width, dtype, device)
        self.spill = self._allocate(total - on_device, width, dtype, torch.device("cpu"))
        self.pin = device.type == "cuda"  # host rows go through pinned memory to a CUDA store
        self.cached = torch.zeros(len(lengths), dtype=torch.bool)
        self.hits = self.misses = 0

    @property
    def device_gib(self) -> float:
        return _gib(self.store)

    @property
    def host_gib(self) -> float:
        return _gib(self.spill)

    @property
    def gib(self) -> float:
        return self.device_gib + self.host_gib

    @staticmethod
    def _allocate(tokens: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        try:
            return torch.empty(tokens, width, dtype=dtype, device=device)
        except (RuntimeError, torch.OutOfMemoryError) as err:
            gib = tokens * width * torch.empty((), dtype=dtype).element_size() / 2**30
            hint = ("train.feature_cache_gib (the rest in host memory), " if device.type == "cuda" else "")
            raise ValueError(f"train.feature_cache: {tokens:,} tokens x {width} features need {gib:.1f} GiB "
                             f"on {device}, which could not be allocated ({type(err).__name__}); use "
                             f"{hint}train.feature_cache=cpu, fewer examples, or off") from None

    def next_step(self):
        return self.source.next_step()

    def finish(self) -> None:
        self.source.finish()

    summary_key = "feature_cache"

    def report_line(self, report: dict) -> str:
        return f"feature cache: {report['hits']} steps from the cache, {report['misses']} ran the target"

    def report(self) -> dict:
        """Steps served from the cache (no target forward), steps that ran the target, and the
        cache's size (of which ``host_gib`` spilled to host memory)."""
        return {"hits": self.hits, "misses": self.misses, "gib": round(self.gib, 2),
                "host_gib": round(self.host_gib, 2)}

    def describe(self) -> str:
        """One line for the run's log: the cache's size and where it lives."""
        where = f"{self.gib:.1f} GiB on {self.store.device}"
        if self.spill.shape[0]:
            where = (f"{self.device_gib:.1f} GiB on {self.store.device} + {self.host_gib:.1f} GiB in host memory "
                     "(train.feature_cache_gib)")
        return (f"feature cache: {int(self.offsets[-1]):,} tokens x {self.store.shape[1]} features, {where}; "
                "target forwards stop once every conversation has been seen")

    # -- host work (the prefetching thread calls these ahead of the step) --------------------
    def layout(self, micro_batch) -> CacheLayout:
        """The micro-batch's ``CacheLayout``, computed once (into ``micro_batch.host``)."""
        if "cache_layout" not in micro_batch.host:
            micro_batch.host["cache_layout"] = self._layout(micro_batch)
        return micro_batch.host["cache_layout"]

    def _layout(self, micro_batch) -> CacheLayout:
        docs = micro_batch.doc_ids
        if docs is None:  # one conversation per row, right-padded
            docs = torch.where(micro_batch.attention_mask.bool(), micro_batch.sample_ids[:, None], -1)
        _, positions = document_layout(docs)
        real = docs >= 0
        slots = real.flatten().nonzero().squeeze(1)
        rows = (self.offsets[docs.clamp(min=0)] + positions).flatten()[slots]
        split = self.store.shape[0]
        here = rows < split
        return CacheLayout(docs[real].unique(), slots[here], rows[here], slots[~here], rows[~here] - split)

    def prefetch(self, micro_batch) -> None:
        """Gather the micro-batch's spilled rows into pinned memory now, if all its conversations
        are cached (rows, once written, never change; a conversation is marked cached only after
        its rows are written, so a gather that sees the mark reads finished rows)."""
        layout = self.layout(micro_batch)
        if layout.spill_rows.numel() and bool(self.cached[layout.samples].all()):
            micro_batch.host["cache_spill"] = self._gather_spill(layout)

    def _gather_spill(self, layout: CacheLayout) -> torch.Tensor:
        out = torch.empty(layout.spill_rows.numel(), self.spill.shape[1], dtype=self.spill.dtype, pin_memory=self.pin)
        return torch.index_select(self.spill, 0, layout.spill_rows, out=out)

    # -- the step ------------------------------------------------------------------------------
    def features(self, micro_batch, input_ids, attention_mask):
        layout = self.layout(micro_batch)
        if bool(self.cached[layout.samples].all()):
            self.hits += 1
            return self._read(micro_batch, layout, input_ids)
        self.misses += 1
        features = self.source.features(micro_batch, input_ids, attention_mask)
        self._write(layout, features)
        self.cached[layout.samples] = True  # after the rows are written (see ``prefetch``)
        return features

    def _read(self, micro_batch, layout: CacheLayout, input_ids) -> torch.Tensor:
        device, width = input_ids.device, self.store.shape[1]
        out = torch.zeros(*input_ids.shape, width, dtype=self.store.dtype, device=device)
        flat = out.view(-1, width)
        rows = layout.rows.to(self.store.device, non_blocking=True)
        flat.index_copy_(0, layout.slots.to(device, non_blocking=True), self.store.index_select(0, rows).to(device))
        if layout.spill_rows.numel():
            spilled = micro_batch.host.pop("cache_spill", None)
            if spilled is None:
                spilled = self._gather_spill(layout)
            flat.index_copy_(0, layout.spill_slots.to(device, non_blocking=True),
                             spilled.to(device, non_blocking=self.pin))
        return out

    def _write(self, layout: CacheLayout, features: torch.Tensor) -> None:
        flat = features.reshape(-1, self.store.shape[1])
        real = flat.index_select(0, layout.slots.to(flat.device, non_blocking=True))
        self.store.index_copy_(0, layout.rows.to(self.store.device, non_blocking=True),
                               real.to(self.store.device, self.store.dtype))
        if layout.spill_rows.numel():  # a synchronous copy: the rows must be written before they are marked
            spilled = flat.index_select(0, layout.spill_slots.to(flat.device, non_blocking=True))
            self.spill.index_copy_(0, layout.spill_rows, spilled.to("cpu", self.spill.dtype))


def _gib(t: torch.Tensor) -> float:
    return t.numel() * t.element_size() / 2**30
