"""The next steps' micro-batches, collated and prepared on the host by a background thread.

Why: with a small target the GPU finishes a step before the host has built the next one: on an
H200 the SmolLM2 recipe's host work per step (collating packed rows from the Arrow table, drawing
each conversation's anchors, the feature cache's row indices) came before every step's launches,
the GPU idle meanwhile (torch.profiler, `docs/results/smollm2-h200-6`). Here it runs ``depth``
steps ahead, beside the main thread. The two threads share the GIL (PyTorch's kernels release it,
Python code does not): in a profiled A/B on the H200 the main thread's compiled-layer calls took
~1.8x the host time with the producer running, and steps served from the feature cache were not
faster (README, "fifth run"); whether it pays depends on how much host work a step has.

Nothing changes in what is trained: the producer calls the same ``BatchIterator.next_step``
in the same order and ``prepare(micro_batch)`` (anchors etc.: pure functions of the micro-batch,
seeded by sample and epoch) stores its results in ``micro_batch.host``. A checkpoint records the
iterator's position after the last step the trainer CONSUMED, not the producer's, so a resumed
run continues exactly where the saved one stopped. ``load_state_dict`` is only allowed before
the first step is taken (the thread starts then).
"""

from __future__ import annotations

import queue
import threading


class PrefetchedBatches:
    def __init__(self, batches, prepare=None, depth: int = 2, pin_memory: bool = False):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self.batches, self.prepare, self.depth, self.pin = batches, prepare, depth, pin_memory
        self.queue: queue.Queue | None = None
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.consumed_state: dict | None = None

    def __getattr__(self, name):  # steps_per_epoch, plan, ...: the wrapped iterator's
        if name == "batches":
            raise AttributeError(name)
        return getattr(self.batches, name)

    # -- the producer ---------------------------------------------------------------------
    def _host_ready(self, micro_batch):
        if self.prepare is not None:
            self.prepare(micro_batch)
        if self.pin:
            for name in ("input_ids", "loss_mask", "attention_mask", "doc_ids"):
                value = getattr(micro_batch, name)
                if value is not None:
                    setattr(micro_batch, name, value.pin_memory())
        return micro_batch

    def _put(self, item) -> None:
        """Into the queue, unless ``close`` is called meanwhile (then nobody will take it)."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _produce(self) -> None:
        try:
            while not self.stop.is_set():
                step = [self._host_ready(mb) for mb in self.batches.next_step()]
                self._put((step, self.batches.state_dict()))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(err)

    def _start(self) -> None:
        self.consumed_state = self.batches.state_dict()
        self.queue = queue.Queue(maxsize=self.depth)
        self.thread = threading.Thread(target=self._produce, name="dflash-prefetch", daemon=True)
        self.thread.start()

    # -- the consumer ---------------------------------------------------------------------
    def next_step(self):
        if self.thread is None:
            self._start()
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        step, self.consumed_state = item
        return step

    def state_dict(self) -> dict:
        return dict(self.consumed_state) if self.thread is not None else self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.thread is not None:
            raise RuntimeError("the prefetching iterator has started; load its state before the first step")
        self.batches.load_state_dict(state)

    def close(self) -> None:
        """Stop the producer (it may be blocked on a full queue or inside a step)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)

