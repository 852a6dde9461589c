"""Disaggregated training: target ranks compute features, drafter ranks train on them.

Topology (``--target-ranks N --drafter-ranks M``, N + M == WORLD_SIZE): ranks ``0..M-1``
are drafters (so drafter rank r == global rank r: rank 0 logs and writes checkpoints), ranks
``M..M+N-1`` are targets.

Data: every rank builds the same ``BatchPlan`` (packed rows or not). A drafter walks its own ``BatchIterator``
(rank r of M) exactly as in colocated training; a target walks one global iterator
(world 1, ``grad_accum * M`` micro-batches per step) whose step is the concatenation of
the M drafters' shares. The k-th micro-batch a drafter d needs in this run (k counted
from where the run starts) is served by target ``(d + k) % N``: round-robin over targets
per drafter, so each target does ~1/N of every drafter's work.

Protocol (all tensors int64 on the comm device unless noted; p2p ``isend``/``recv``):

* drafter -> target control messages ``[kind, a, b, c, d]``: START (once, with the data
  position ``epoch, micro_batch, steps_done`` and the steps left), REQUEST k (one per
  micro-batch, all of a step's requests sent before its receives), STOP (once, after the
  drafter's last step; also when stopping early on a signal).
* target -> drafter per micro-batch: a header ``[rows, seq, feat, epoch, k, dtype,
  forward_us, wait_us]``, then the int payload (input ids, loss mask, attention mask,
  sample ids flattened), then the features ``[rows, seq, feat]`` in the target dtype.

Backpressure: a target computes ahead at most ``inflight`` micro-batches per drafter
(default 2, ``DFLASH_INFLIGHT``) and sends one only when its drafter requests it, so
memory is bounded and a fast target never floods a slow drafter. Targets compute and
serve in global micro-batch order, so no cycle of waits can form (the oldest unserved
micro-batch's drafter can always request it). The drafter checks that the received
sample ids and epoch are the ones its own iterator expects (a desync is an error, not a
silent mistake). A target rank's ``wait`` time is time blocked waiting for a request
(the drafters are the bottleneck); a drafter's ``recv_wait`` is time blocked waiting
for features (the targets are the bottleneck). Both appear in ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dflash_train.config import JobConfig
from dflash_train.data import BatchIterator, MicroBatch
from dflash_train.distributed import watchdog
from dflash_train.files import explained
from dflash_train.models.target import Target
from dflash_train.run_folder import WRITE_TODO
from dflash_train.train.assembly import load_data, resolve_drafter
from dflash_train.train.parallelize import compile_target_if
from dflash_train.train.signals import StopOnSignals

START, REQUEST, STOP = 0, 1, 2
CONTROL = 5
HEADER = 8
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@dataclass
class Topology:
    world: int
    target_ranks: int = 0  # 0: colocated
    drafter_ranks: int = 0

    @classmethod
    def build(cls, world: int, target_ranks: int = 0, drafter_ranks: int = 0) -> Topology:
        if not target_ranks and not drafter_ranks:
            return cls(world)
        if target_ranks < 1 or drafter_ranks < 1:
            raise ValueError("--target-ranks and --drafter-ranks must both be >= 1 (or both omitted: colocated)")
        if target_ranks + drafter_ranks != world:
            raise ValueError(f"--target-ranks {target_ranks} + --drafter-ranks {drafter_ranks} != WORLD_SIZE {world}"
                             " (torchrun --nnodes * --nproc-per-node)")
        return cls(world, target_ranks, drafter_ranks)

    @property
    def disaggregated(self) -> bool:
        return self.target_ranks > 0

    def is_drafter(self, rank: int) -> bool:
        return rank < self.drafter_ranks

    def drafters(self) -> list[int]:
        return list(range(self.drafter_ranks))

    def targets(self) -> list[int]:
        return list(range(self.drafter_ranks, self.world))

    def target_for(self, drafter: int, k: int) -> int:
        """Global rank of the target that serves drafter ``drafter``'s k-th micro-batch."""
        return self.drafter_ranks + (drafter + k) % self.target_ranks


def inflight() -> int:
    return max(1, int(os.environ.get("DFLASH_INFLIGHT", "2")))


def strip_decoder_layers(target: Target) -> None:
    """Drafter ranks need only the embedding, final norm, lm_head and tokenizer: replace the
    decoder layers by placeholders (the layer count stays, for validation)."""
    placeholders = nn.ModuleList([nn.Identity() for _ in target.layers])
    setattr(target._layer_owner, target._layer_attr, placeholders)


def _peer_error(err: Exception, what: str) -> RuntimeError:
    return RuntimeError(f"{what} failed: that rank died, hung or was stopped ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})")


# -- drafter side ---------------------------------------------------------------------------------
class FeatureReceiver:
    """A drafter trainer's feature source (``train/features.py``): micro-batches come from the
    trainer's own iterator (positions, checkpoints) and are checked against what the targets
    sent; the features come from the targets."""

    def __init__(self, trainer, topo: Topology, rank: int, comm_device: torch.device, timings):
        self.trainer, self.topo, self.rank = trainer, topo, rank
        self.local: BatchIterator = trainer.batches
        self.comm = comm_device
        self.timings = timings
        self.k = 0
        self.started = self.finished = False
        self.received: dict[int, torch.Tensor] = {}

    def _control(self, dst: int, kind: int, *values: int):
        msg = torch.zeros(CONTROL, dtype=torch.long)
        msg[0] = kind
        msg[1:1 + len(values)] = torch.tensor(values, dtype=torch.long)
        return dist.isend(msg.to(self.comm), dst=dst)

    def _start(self) -> None:
        state = self.local.state_dict()
        remaining = max(0, self.trainer.total_steps - self.trainer.counters.step)
        works = [self._control(t, START, state["epoch"], state["micro_batch"], state["steps_done"], remaining)
                 for t in self.topo.targets()]
        for w in works:
            w.wait()
        self.started = True

    def finish(self) -> None:
        """Tell every target this drafter needs nothing more (idempotent)."""
        if self.finished:
            return
        if not self.started:
            self._start()
        for w in [self._control(t, STOP) for t in self.topo.targets()]:
            w.wait()
        self.finished = True

    def next_step(self) -> list[MicroBatch]:
        if not self.started:
            self._start()
        expected = self.local.next_step()
        sources = [self.topo.target_for(self.rank, self.k + i) for i in range(len(expected))]
        requests = [self._control(src, REQUEST, self.k + i) for i, src in enumerate(sources)]
        for i, (mb, src) in enumerate(zip(expected, sources)):
            self.received[id(mb)] = self._receive(mb, src, self.k + i)
        for w in requests:
            w.wait()
        self.k += len(expected)
        return expected

    def _receive(self, mb: MicroBatch, src: int, k: int) -> torch.Tensor:
        start = time.perf_counter()
        try:
            header = torch.zeros(HEADER, dtype=torch.long, device=self.comm)
            dist.recv(header, src=src)
            rows, seq, feat, epoch, got_k, dtype, fwd_us, wait_us = header.tolist()
            ints = torch.empty(3 * rows * seq + rows, dtype=torch.long, device=self.comm)
            dist.recv(ints, src=src)
            features = torch.empty(rows, seq, feat, dtype=DTYPES[dtype], device=self.comm)
            dist.recv(features, src=src)
        except RuntimeError as err:
            raise _peer_error(err, f"drafter rank {self.rank}: receiving micro-batch {k} from target rank {src}") \
                from None
        # outside the timed step span (features arrive in next_step), so not subtracted from it
        self.timings.add("drafter_recv_wait", time.perf_counter() - start, local=False)
        self.timings.add("target_forward", fwd_us / 1e6, local=False)
        self.timings.add("target_wait", wait_us / 1e6, local=False)
        ints = ints.cpu()
        n = rows * seq
        sample_ids = ints[3 * n:]
        if got_k != k or epoch != mb.epoch or not torch.equal(sample_ids, mb.sample_ids) \
                or not torch.equal(ints[:n].view(rows, seq), mb.input_ids):
            raise RuntimeError(f"drafter rank {self.rank}: target rank {src} sent micro-batch {got_k} (epoch {epoch}, "
                               f"samples {sample_ids.tolist()[:4]}...) but micro-batch {k} (epoch {mb.epoch}, samples "
                               f"{mb.sample_ids.tolist()[:4]}...) was expected: the ranks' data or configs differ")
        return features

    def features(self, micro_batch: MicroBatch, input_ids, attention_mask) -> torch.Tensor:
        return self.received.pop(id(micro_batch)).to(self.trainer.device, non_blocking=True)


# -- target side ----------------------------------------------------------------------------------
class TargetServer:
    """A target rank: computes features for its share of every drafter's micro-batches."""

    def __init__(self, target: Target, topo: Topology, rank: int, device: torch.device, comm_device: torch.device,
                 cfg: JobConfig, echo=print):
        """``cfg``: the job. The drafter config and the batch plan come from the run's assembly
        (``train/assembly.py``), as the drafter ranks build theirs: the same feature layers, the same
        micro-batches in the same order (``train`` gives seed, grad_accum, run_dir, log_every)."""
        self.target, self.topo, self.rank = target, topo, rank
        self.device, self.comm, self.echo = device, comm_device, echo
        self.index = rank - topo.drafter_ranks
        compile_target_if(target, cfg.target, device)
        self.drafter_cfg = resolve_drafter(cfg.drafter, target)
        data = load_data(cfg, target.tokenizer, self.drafter_cfg.block_size)  # the drafters' plan, packed or not
        self.per_drafter = cfg.train.grad_accum
        self.log_every = cfg.train.log_every
        self.batches = data.batches(0, 1, self.per_drafter * topo.drafter_ranks)
        self.log_path = Path(cfg.train.run_dir) / f"target-rank{rank}.jsonl"

    def _recv_control(self, src: int) -> list[int]:
        msg = torch.zeros(CONTROL, dtype=torch.long, device=self.comm)
        try:
            dist.recv(msg, src=src)
        except RuntimeError as err:
            raise _peer_error(err, f"target rank {self.rank}: waiting for drafter rank {src}") from None
        return msg.tolist()

    def _items(self, remaining: int):
        """(drafter, k, micro-batch) assigned to this target, in global order."""
        ks = [0] * self.topo.drafter_ranks
        for _ in range(remaining):
            step = self.batches.next_step()
            for d in self.topo.drafters():
                for mb in step[d * self.per_drafter:(d + 1) * self.per_drafter]:
                    k = ks[d]
                    ks[d] += 1
                    if self.topo.target_for(d, k) == self.rank:
                        yield d, k, mb

    def serve(self) -> dict:
        """Serve until every drafter said STOP. Returns totals (seconds, items)."""
        starts = [self._recv_control(d) for d in self.topo.drafters()]
        for d, msg in enumerate(starts):
            if msg[0] != START or msg[1:] != starts[0][1:]:
                raise RuntimeError(f"target rank {self.rank}: drafter rank {d} sent {msg}, expected START like {starts[0]}")
        _, epoch, position, steps_done, remaining = starts[0]
        self.batches.load_state_dict({"epoch": epoch, "micro_batch": position, "steps_done": steps_done})
        with StopOnSignals(self._on_signal):
            return self._loop(self._items(remaining))

    def _on_signal(self, name: str) -> None:
        # The drafters decide when to stop (they finish the step, save, and send STOP).
        self.echo(f"target rank {self.rank}: {name}, serving until the drafters stop")

    def _loop(self, items) -> dict:
        queue: deque = deque()  # (drafter, k, header, ints, features) in global order
        queued = [0] * self.topo.drafter_ranks
        stopped: set[int] = set()
        sends: dict[int, list] = {}
        totals = {"forward_s": 0.0, "wait_s": 0.0, "send_s": 0.0, "items": 0}
        window = dict.fromkeys(("forward_s", "wait_s", "send_s", "items"), 0.0)
        pending = next(items, None)
        last_log = time.perf_counter()
        served = 0
        while True:
            pending = self._compute_ahead(pending, items, queue, queued, stopped, window)
            if not queue:
                break
            d, k, header, ints, features = queue.popleft()
            queued[d] -= 1
            if d in stopped:
                continue
            start = time.perf_counter()
            msg = self._recv_control(d)
            waited = time.perf_counter() - start
            window["wait_s"] += waited
            if msg[0] == STOP:
                stopped.add(d)
                continue
            if msg[0] != REQUEST or msg[1] != k:
                raise RuntimeError(f"target rank {self.rank}: drafter rank {d} sent {msg}, expected REQUEST {k}")
            header[7] = int(waited * 1e6)
            start = time.perf_counter()
            for w in sends.pop(d, []):
                w.wait()
            sends[d] = [dist.isend(t, dst=d) for t in (header.to(self.comm), ints, features)]
            window["send_s"] += time.perf_counter() - start
            window["items"] += 1
            served += 1
            # Steady once every drafter has surely finished its first (compiling) step.
            watchdog.beat(f"served micro-batch {k} of drafter rank {d}",
                          steady=served > 2 * self.per_drafter * self.topo.drafter_ranks)
            if time.perf_counter() - last_log > 10 or window["items"] >= self.log_every * 4:
                self._log(window, totals)
                last_log = time.perf_counter()
        self._await_stops(stopped)
        for works in sends.values():
            for w in works:
                w.wait()
        self._log(window, totals)
        return totals

    def _compute_ahead(self, pending, items, queue: deque, queued: list[int], stopped: set[int], window: dict):
        """Compute items in global order while the next one's drafter has room (at most
        ``inflight()`` queued per drafter; a stopped drafter's items are skipped); returns the
        next item not computed yet (None: none left)."""
        while pending is not None and (pending[0] in stopped or queued[pending[0]] < inflight()):
            d, k, mb = pending
            if d not in stopped:
                start = time.perf_counter()
                queue.append(self._compute(d, k, mb))
                queued[d] += 1
                elapsed = time.perf_counter() - start
                queue[-1][2][6] = int(elapsed * 1e6)
                window["forward_s"] += elapsed
            pending = next(items, None)
        return pending

    def _await_stops(self, stopped: set[int]) -> None:
        """Every drafter that has not said STOP yet must say it now (nothing else is expected)."""
        for d in self.topo.drafters():
            if d not in stopped:
                msg = self._recv_control(d)
                if msg[0] != STOP:
                    raise RuntimeError(f"target rank {self.rank}: drafter rank {d} sent {msg} after the last step")

    @torch.no_grad()
    def _compute(self, d: int, k: int, mb: MicroBatch):
        ids = mb.input_ids.to(self.device, non_blocking=True)
        attention = mb.attention_mask.to(self.device, non_blocking=True)
        docs = None if mb.doc_ids is None else mb.doc_ids.to(self.device, non_blocking=True)  # packed rows
        features = self.target.features(ids, attention, self.drafter_cfg.target_layer_ids, docs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # honest forward time
        features = features.to(self.comm).contiguous()
        rows, seq, feat = features.shape
        header = torch.tensor([rows, seq, feat, mb.epoch, k, DTYPES.index(features.dtype), 0, 0], dtype=torch.long)
        ints = torch.cat([mb.input_ids.flatten(), mb.loss_mask.flatten(), mb.attention_mask.flatten(),
                          mb.sample_ids]).to(self.comm)
        return d, k, header, ints, features

    def _log(self, window: dict, totals: dict) -> None:
        if not window["items"] and not window["forward_s"]:
            return
        busy = window["forward_s"] + window["send_s"]
        record = {"rank": self.rank, "role": "target", **{k: round(v, 6) for k, v in window.items()},
                  "busy_fraction": busy / max(busy + window["wait_s"], 1e-9), "time": time.time()}
        with explained("cannot write the target rank's log", self.log_path, WRITE_TODO):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        self.echo(f"target rank {self.rank}: {int(window['items'])} micro-batches, forward {window['forward_s']:.2f}s, "
                  f"waiting for drafters {window['wait_s']:.2f}s, send {window['send_s']:.2f}s "
                  f"(busy {record['busy_fraction']:.0%})")
        for key in window:
            totals[key] += window[key]
            window[key] = 0.0
