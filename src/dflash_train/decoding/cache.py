"""The decoding caches (the target's K/V, the drafter's context K/V) and CUDA-graph capture.

A CUDA graph replays kernels on the addresses it saw at capture, so everything a
captured decoding step reads or writes must live in tensors allocated once:
:class:`KVBuffers` is a Hugging Face-compatible cache (``update`` writes at given
positions, never grows) whose per-layer storage is one flat allocation reshaped per
bucket shape, and :func:`capture_cuda_graph` records one such step. Used by the batched
generator (:mod:`.batched`) and the static-shape speculative decoder (:mod:`.static`).

:class:`DrafterContextCache` is the drafter's one context cache, for every engine: the reference
loop and replay append to it, the static engine writes it at fixed slots (``slotted``).
"""

from __future__ import annotations

import torch

from dflash_train.devices import graph_capture


class KVBuffers:
    """Per-layer K/V storage that the model's attention writes through ``cache.update``.

    ``pos`` (1-D long tensor) holds the cache positions the next forward writes; ``rows``
    selects a contiguous row range (for prefill in row chunks)."""

    is_compileable = True  # tells HF mask helpers this is a static cache (we pass 4D masks anyway)

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device):
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.capacity = 0  # in tokens (batch x length)
        self.flat_k: list[torch.Tensor] = []
        self.flat_v: list[torch.Tensor] = []
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.pos: torch.Tensor | None = None
        self.rows: slice = slice(None)
        self.generation = 0  # bumped on reallocation: captured graphs are then stale
        self._views: dict = {}

    @classmethod
    def for_model(cls, model, device) -> KVBuffers:
        """Empty buffers shaped for a Hugging Face decoder's layers, K/V heads and dtype."""
        cfg = model.config
        cfg = getattr(cfg, "text_config", None) or cfg
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return cls(cfg.num_hidden_layers, kv_heads, head_dim, next(model.parameters()).dtype, device)

    def reserve(self, tokens: int) -> None:
        if tokens <= self.capacity:
            return
        self.flat_k = self.flat_v = []  # free before allocating the larger buffers
        self.k = self.v = []
        self._views = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        n = tokens * self.kv_heads * self.head_dim
        self.flat_k = [torch.zeros(n, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.flat_v = [torch.zeros(n, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.capacity = tokens
        self.generation += 1

    def view(self, batch: int, length: int) -> None:
        """Shape the buffers as ``(batch, kv_heads, length, head_dim)`` contiguous views."""
        self.reserve(batch * length)
        key = (batch, length, self.generation)
        if key not in self._views:  # the same view objects per shape (stable for torch.compile guards)
            n = batch * self.kv_heads * length * self.head_dim
            shape = (batch, self.kv_heads, length, self.head_dim)
            self._views = {k: v for k, v in self._views.items() if k[2] == self.generation}
            self._views[key] = ([f[:n].view(shape) for f in self.flat_k], [f[:n].view(shape) for f in self.flat_v])
        self.k, self.v = self._views[key]

    # the Cache interface the attention layers use
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.k[layer_idx][self.rows], self.v[layer_idx][self.rows]
        k.index_copy_(2, self.pos, key_states.to(k.dtype))
        v.index_copy_(2, self.pos, value_states.to(v.dtype))
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:  # only used when position_ids are missing
        raise RuntimeError("KVBuffers needs explicit position_ids")

    def __len__(self) -> int:
        return self.num_layers


class DrafterContextCache:
    """Per-layer K/V of the drafter's *context* positions (never block K/V), in buffers it owns.

    ``DFlashAttention.forward`` calls :meth:`extend` with the K/V of the new context positions
    (RoPE already applied) and attends over what it returns. One class, two ways to write:

    * **appending** (``DrafterContextCache()``: the reference loop, replay): the new positions go
      after those held, and the held ones come back (a view of the buffer). Buffers are allocated
      at the first ``extend`` and double when full, so a long answer costs amortized O(1) copies per
      step instead of a ``cat`` of the whole context. All layers see the same new positions: the
      cache's length is layer 0's.
    * **slotted** (:meth:`slotted`: the static engine, whose CUDA graph needs fixed shapes and
      addresses): ``slots`` positions preallocated per layer; before each forward the caller sets
      ``write_pos`` (one slot per new row; rows it does not want go to a scratch slot), and
      :meth:`extend` returns every slot: the caller's mask hides what a query must not see.
    """

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []  # per layer: [b, kv_heads, capacity, d]
        self.v: list[torch.Tensor] = []
        self.lengths: list[int] = []  # appending: positions held per layer
        self.write_pos: torch.Tensor | None = None  # slotted: where the next rows go

    @classmethod
    def slotted(cls, num_layers: int, kv_heads: int, head_dim: int, slots: int, dtype, device) -> DrafterContextCache:
        """Fixed buffers of ``slots`` positions per layer, written at ``write_pos``."""
        cache = cls()
        shape = (1, kv_heads, slots, head_dim)
        cache.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        cache.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        cache.write_pos = torch.zeros(0, dtype=torch.long, device=device)
        return cache

    def extend(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``k``/``v`` [b, kv_heads, new, d]; return this layer's K/V: the held positions
        (appending) or every slot (slotted)."""
        if self.write_pos is not None:
            self.k[layer_idx].index_copy_(2, self.write_pos, k.to(self.k[layer_idx].dtype))
            self.v[layer_idx].index_copy_(2, self.write_pos, v.to(self.v[layer_idx].dtype))
            return self.k[layer_idx], self.v[layer_idx]
        if layer_idx == len(self.k):
            self.k.append(k.new_empty(*k.shape[:2], 0, k.shape[3]))
            self.v.append(v.new_empty(*v.shape[:2], 0, v.shape[3]))
            self.lengths.append(0)
        start, end = self.lengths[layer_idx], self.lengths[layer_idx] + k.shape[2]
        if end > self.k[layer_idx].shape[2]:
            self._grow(layer_idx, max(end, 2 * self.k[layer_idx].shape[2]))
        self.k[layer_idx][:, :, start:end] = k
        self.v[layer_idx][:, :, start:end] = v
        self.lengths[layer_idx] = end
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]

    def _grow(self, layer_idx: int, capacity: int) -> None:
        held = self.lengths[layer_idx]
        for buffers in (self.k, self.v):
            old = buffers[layer_idx]
            buffers[layer_idx] = old.new_empty(*old.shape[:2], capacity, old.shape[3])
            buffers[layer_idx][:, :, :held] = old[:, :, :held]

    def get_seq_length(self) -> int:
        return self.lengths[0] if self.lengths else 0

    def __len__(self) -> int:
        return self.get_seq_length()

    def crop(self, length: int) -> None:
        """Keep the first ``length`` context positions of every layer (appending)."""
        self.lengths = [min(n, length) for n in self.lengths]

    def reset(self) -> None:
        """Nothing held (appending); the buffers are dropped."""
        self.k, self.v, self.lengths = [], [], []


def capture_cuda_graph(fn):
    """``(graph, outputs)`` of ``fn()``, which must read and write only fixed tensors.

    ``fn`` runs once on a side stream first (allocations, kernel choice), then once under
    capture; ``graph.replay()`` afterwards recomputes ``outputs`` in place. Whatever ``fn``
    writes (a KV cache) is written by the warm-up too, so ``fn`` must be idempotent."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph):
        outputs = fn()
    return graph, outputs
