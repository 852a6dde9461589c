"""Length-bucketed, token-budgeted, deterministic and resumable micro-batches.

``BatchPlan`` turns the dataset lengths into one shuffled list of micro-batches per
epoch; it depends only on (seed, epoch, lengths, options), so every rank computes the
same list without communication. ``BatchIterator`` walks that list as a stream: one
optimizer step (a "global step") consumes ``micro_batches_per_step * world_size``
consecutive micro-batches and rank r takes its contiguous share, so which samples form a
global step never depends on the number of ranks.

End of epoch: with ``drop_last=False`` (default) a trailing partial global step wraps
into the next epoch (it is completed with the first micro-batches of the next epoch's
list; each ``MicroBatch`` carries its own epoch), so every sample is seen exactly once per
epoch. With ``drop_last=True`` the trailing partial global step is dropped and the next
epoch starts at its first micro-batch.

Packing (``pack_length``, ``data.pack``): instead of one conversation per row, rows of
exactly ``pack_length`` tokens hold as many conversations as fit (best-fit
decreasing inside each shuffled window), so the padding of short conversations is
filled with other conversations while the shape stays static. A packed micro-batch
is a list of rows, each a list of sample ids, and its ``MicroBatch.doc_ids`` names
every token's conversation so that the target, the drafter's mask and the anchors
keep conversations apart.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class MicroBatch:
    """All tensors on CPU; padding rows have ``sample_ids == -1`` and all-zero masks."""

    input_ids: torch.LongTensor  # [rows, seq], right-padded with pad_id
    loss_mask: torch.LongTensor  # [rows, seq] 0/1
    attention_mask: torch.LongTensor  # [rows, seq] 1 on real tokens
    sample_ids: torch.LongTensor  # [rows] (packed rows: the row's first sample)
    epoch: int
    # Packed micro-batches only: [rows, seq] the sample id of each token's conversation,
    # -1 on padding. None: one conversation per row.
    doc_ids: torch.LongTensor | None = None
    # Host-side results computed ahead of the step (data/prefetch.py): "anchors" (anchors, keep),
    # "cache_layout" (the feature cache's indices), "num_samples". Pure functions of the fields above.
    host: dict = field(default_factory=dict, repr=False, compare=False)

    def num_samples(self) -> int:
        """Conversations in this micro-batch (a packed row holds several)."""
        if "num_samples" not in self.host:
            if self.doc_ids is None:
                self.host["num_samples"] = int((self.sample_ids >= 0).sum())
            else:
                self.host["num_samples"] = sum(int(row[row >= 0].unique().numel()) for row in self.doc_ids)
        return self.host["num_samples"]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class BatchPlan:
    """Deterministic micro-batch lists per epoch; the same on every rank.

    Samples are shuffled per (seed, epoch), sorted by length inside windows of
    ``bucket_window`` samples (so batches are length-homogeneous yet differ between
    epochs), packed greedily under the token budget, and the batch order is shuffled.
    With ``pack_length`` every row is that long and holds several samples (see the
    module docstring).
    """

    def __init__(self, lengths: list[int], token_budget: int, seed: int, pad_to_multiple: int = 64,
                 max_rows: int | None = None, fixed_rows: bool = True, drop_last: bool = False,
                 max_length: int | None = None, bucket_window: int = 2048, pack_length: int | None = None):
        self.lengths = np.asarray(list(lengths), dtype=np.int64)
        self.token_budget, self.seed, self.multiple = int(token_budget), int(seed), int(pad_to_multiple)
        self.max_rows, self.fixed_rows, self.drop_last = max_rows, fixed_rows, drop_last
        self.max_length = max_length
        self.bucket_window = bucket_window
        self.pack_length = pack_length
        self._check()
        self._cache: dict[int, list[list[int]]] = {}

    def _check(self) -> None:
        if len(self.lengths) == 0:
            raise ValueError("BatchPlan: the dataset is empty")
        if self.lengths.min() <= 0:
            raise ValueError("BatchPlan: every example needs at least one token")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError("BatchPlan: max_rows must be >= 1")
        longest = int(self.lengths.max())
        if self.pack_length is not None:
            if longest > self.pack_length:
                raise ValueError(f"packing: an example of {longest} tokens does not fit a row of "
                                 f"{self.pack_length} (data.max_length)")
            if self.rows_for(self.pack_length) < 1:
                raise ValueError(f"token_budget {self.token_budget} is smaller than one packed row "
                                 f"({self.pack_length} tokens)")
            return
        if self.seq_len(longest) > self.token_budget:
            raise ValueError(f"token_budget {self.token_budget} is smaller than the longest example "
                             f"padded to a multiple of {self.multiple} ({self.seq_len(longest)})")

    def seq_len(self, longest: int) -> int:
        """Padded sequence length: rounded up to the multiple, capped at max_length when set."""
        seq = _round_up(longest, self.multiple)
        if self.max_length is not None and longest <= self.max_length:
            seq = min(seq, self.max_length)
        return seq

    def rows_for(self, seq: int) -> int:
        rows = self.token_budget // seq
        return min(rows, self.max_rows) if self.max_rows is not None else rows

    def epoch_micro_batches(self, epoch: int) -> list[list[int]]:
        if epoch not in self._cache:
            self._cache = {epoch: self._build(epoch)}  # keep only the current epoch in memory
        return self._cache[epoch]

    def _build(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.lengths))
        if self.pack_length is not None:
            return self._build_packed(order, rng)
        batches: list[list[int]] = []
        for start in range(0, len(order), self.bucket_window):
            window = order[start:start + self.bucket_window]
            window = window[np.argsort(self.lengths[window], kind="stable")]
            batches.extend(self._pack(window))
        perm = rng.permutation(len(batches))
        return [batches[i] for i in perm]

    def _build_packed(self, order: np.ndarray, rng: np.random.Generator) -> list[list[list[int]]]:
        """Packed rows per shuffled window, shuffled, then cut into micro-batches of rows."""
        rows: list[list[int]] = []
        for start in range(0, len(order), self.bucket_window):
            rows.extend(self._fill_rows(order[start:start + self.bucket_window]))
        rows = [rows[i] for i in rng.permutation(len(rows))]
        per_batch = self.rows_for(self.pack_length)
        return [rows[i:i + per_batch] for i in range(0, len(rows), per_batch)]

    def _fill_rows(self, ids: np.ndarray) -> list[list[int]]:
        """Best-fit decreasing: longest first, each into the row it fills most tightly."""
        rows: list[list[int]] = []
        free: list[tuple[int, int]] = []  # (tokens left, row), sorted
        for idx in ids[np.argsort(-self.lengths[ids], kind="stable")].tolist():
            need = int(self.lengths[idx])
            at = bisect.bisect_left(free, (need, -1))
            if at < len(free):
                space, row = free.pop(at)
            else:
                space, row = self.pack_length, len(rows)
                rows.append([])
            rows[row].append(idx)
            if space > need:
                bisect.insort(free, (space - need, row))
        return rows

    def _pack(self, sorted_ids: np.ndarray) -> list[list[int]]:
        out, cur, longest = [], [], 0
        for idx in sorted_ids.tolist():
            new_longest = max(longest, int(self.lengths[idx]))
            if cur and len(cur) + 1 > self.rows_for(self.seq_len(new_longest)):
                out.append(cur)
                cur, new_longest = [], int(self.lengths[idx])
            cur.append(idx)
            longest = new_longest
        if cur:
            out.append(cur)
        return out

    def shape(self, batch: list) -> tuple[int, int]:
        if self.pack_length is not None:
            return (self.rows_for(self.pack_length) if self.fixed_rows else len(batch)), self.pack_length
        seq = self.seq_len(int(self.lengths[batch].max()))
        return (self.rows_for(seq) if self.fixed_rows else len(batch)), seq

    def padding_waste(self, epoch: int = 0) -> float:
        """Fraction of token slots of an epoch's padded micro-batches that hold padding."""
        batches = self.epoch_micro_batches(epoch)
        slots = sum(r * s for r, s in map(self.shape, batches))
        return 1.0 - float(self.lengths.sum()) / slots


class BatchIterator:
    """Yields this rank's micro-batches per optimizer step; ``state_dict`` makes it resumable."""

    def __init__(self, dataset, plan: BatchPlan, pad_id: int, rank: int = 0, world_size: int = 1,
                 micro_batches_per_step: int = 1, start_epoch: int = 0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        if micro_batches_per_step < 1:
            raise ValueError("micro_batches_per_step must be >= 1")
        self.dataset, self.plan, self.pad_id = dataset, plan, int(pad_id)
        self.rank, self.world_size, self.per_rank = rank, world_size, micro_batches_per_step
        self.global_size = micro_batches_per_step * world_size
        self.epoch, self.position, self.steps_done = int(start_epoch), 0, 0

    def steps_per_epoch(self) -> int:
        n = len(self.plan.epoch_micro_batches(self.epoch))
        return n // self.global_size if self.plan.drop_last else -(-n // self.global_size)

    def _take_global(self) -> list[tuple[int, list[int]]]:
        """The next global step's (epoch, sample ids) micro-batches, advancing the cursor."""
        taken: list[tuple[int, list[int]]] = []
        while len(taken) < self.global_size:
            batches = self.plan.epoch_micro_batches(self.epoch)
            remaining = len(batches) - self.position
            if self.plan.drop_last and not taken and remaining < self.global_size:
                self.epoch, self.position = self.epoch + 1, 0  # drop the trailing partial step
                continue
            n = min(self.global_size - len(taken), remaining)
            taken += [(self.epoch, b) for b in batches[self.position:self.position + n]]
            self.position += n
            if self.position >= len(batches):
                self.epoch, self.position = self.epoch + 1, 0  # wrap into the next epoch
        return taken

    def next_step(self) -> list[MicroBatch]:
        if self.plan.drop_last and len(self.plan.epoch_micro_batches(self.epoch)) < self.global_size:
            raise ValueError("drop_last with fewer micro-batches per epoch than one global step")
        taken = self._take_global()
        self.steps_done += 1
        mine = [self.collate(ids, epoch) for epoch, ids in taken[self.rank * self.per_rank:(self.rank + 1) * self.per_rank]]
        for micro_batch in mine:  # the global order's epochs never decrease: the step's first is every rank's least
            micro_batch.host["step_first_epoch"] = taken[0][0]
        return mine

    def collate(self, ids: list, epoch: int) -> MicroBatch:
        if self.plan.pack_length is not None:
            return self.collate_packed(ids, epoch)
        rows, seq = self.plan.shape(ids)
        input_ids = torch.full((rows, seq), self.pad_id, dtype=torch.long)
        loss_mask = torch.zeros((rows, seq), dtype=torch.long)
        attention = torch.zeros((rows, seq), dtype=torch.long)
        sample_ids = torch.full((rows,), -1, dtype=torch.long)
        for r, (idx, row) in enumerate(zip(ids, _rows(self.dataset, ids))):
            n = len(row["input_ids"])
            input_ids[r, :n] = torch.as_tensor(row["input_ids"], dtype=torch.long)
            loss_mask[r, :n] = torch.as_tensor(row["loss_mask"], dtype=torch.long)
            attention[r, :n] = 1
            sample_ids[r] = idx
        return MicroBatch(input_ids, loss_mask, attention, sample_ids, epoch)

    def collate_packed(self, packed_rows: list[list[int]], epoch: int) -> MicroBatch:
        """Concatenate each row's conversations; ``doc_ids`` records which token is whose."""
        rows, seq = self.plan.shape(packed_rows)
        input_ids = torch.full((rows, seq), self.pad_id, dtype=torch.long)
        loss_mask = torch.zeros((rows, seq), dtype=torch.long)
        attention = torch.zeros((rows, seq), dtype=torch.long)
        doc_ids = torch.full((rows, seq), -1, dtype=torch.long)
        sample_ids = torch.full((rows,), -1, dtype=torch.long)
        flat = [idx for row in packed_rows for idx in row]
        data = iter(_rows(self.dataset, flat))
        for r, row in enumerate(packed_rows):
            at = 0
            for idx in row:
                item = next(data)
                n = len(item["input_ids"])
                input_ids[r, at:at + n] = torch.as_tensor(item["input_ids"], dtype=torch.long)
                loss_mask[r, at:at + n] = torch.as_tensor(item["loss_mask"], dtype=torch.long)
                doc_ids[r, at:at + n] = idx
                at += n
            attention[r, :at] = 1
            sample_ids[r] = row[0]
        return MicroBatch(input_ids, loss_mask, attention, sample_ids, epoch, doc_ids)

    def state_dict(self) -> dict:
        """Plain ints: the epoch and micro-batch cursor inside it, and the global steps done."""
        return {"epoch": self.epoch, "micro_batch": self.position, "steps_done": self.steps_done}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["micro_batch"])
        self.steps_done = int(state.get("steps_done", 0))


def _rows(dataset, ids: list[int]) -> list[dict]:
    """Batch row access for a ``datasets.Dataset`` (one Arrow read) or any indexable of dicts."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "select"):
        cols = dataset[ids]
        return [{"input_ids": cols["input_ids"][i], "loss_mask": cols["loss_mask"][i]} for i in range(len(ids))]
    return [dataset[i] for i in ids]
