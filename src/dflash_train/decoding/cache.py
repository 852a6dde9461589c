"""Fixed-address K/V buffers and CUDA-graph capture, shared by the decoding engines.

A CUDA graph replays kernels on the addresses it saw at capture, so everything a
captured decoding step reads or writes must live in tensors allocated once:
:class:`KVBuffers` is a Hugging Face-compatible cache (``update`` writes at given
positions, never grows) whose per-layer storage is one flat allocation reshaped per
bucket shape, and :func:`capture_cuda_graph` records one such step. Used by the batched
generator (:mod:`.batched`) and the static-shape speculative decoder (:mod:`.static`).
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
