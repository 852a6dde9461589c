"""Fewer, wider GEMMs for the static decoder: q/k/v and gate/up projections fused.

A verify step of a small target is a few hundred small matrix products (7 per layer);
in float32 each one at 16 rows costs about a kernel launch whatever its width. Layers
that project the same input several times (``q_proj``, ``k_proj``, ``v_proj`` of the
attention; ``gate_proj``, ``up_proj`` of the MLP) can share one product with the
concatenated weights, split afterwards: every output element is still one dot product
over the same input row, so only the GEMM kernel (and its float rounding) changes.

How, without editing the model's code: inside :meth:`FusedProjections.applied` the first
projection of a group is swapped for a module that computes the whole group's product
and keeps the other parts, which the group's later projections (also swapped) return.
This relies on the layer calling the group's projections in order on one input, as
Llama/Qwen-style layers do (``q, k, v``; ``gate, up``); the originals come back on exit.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


class _Shared:
    """The fused weight of one group and the parts its later projections return."""

    def __init__(self, linears: list[nn.Linear]):
        self.weight = torch.cat([lin.weight for lin in linears]).detach()
        biases = [lin.bias for lin in linears]
        self.bias = torch.cat(biases).detach() if all(b is not None for b in biases) else None
        self.sizes = [lin.out_features for lin in linears]
        self.parts: list[torch.Tensor] = []
        self.input: torch.Tensor | None = None


class _Lead(nn.Module):
    """The group's first projection: one product for the whole group."""

    def __init__(self, shared: _Shared):
        super().__init__()
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.shared.weight, self.shared.bias).split(self.shared.sizes, dim=-1)
        self.shared.parts, self.shared.input = list(out[1:]), x
        return out[0]


class _Follower(nn.Module):
    """A later projection of the group: the part the lead computed."""

    def __init__(self, shared: _Shared, index: int):
        super().__init__()
        self.shared, self.index = shared, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x is not self.shared.input:  # a layer that does not call q, k, v (gate, up) in order on one input
            raise RuntimeError("fused projections: a projection ran on another input than its group's first; "
                               "run this model with fuse_projections=False")
        return self.shared.parts[self.index]


def _fusable(linears) -> bool:
    return (all(isinstance(lin, nn.Linear) for lin in linears)
            and len({lin.in_features for lin in linears}) == 1
            and len({lin.bias is None for lin in linears}) == 1)


class FusedProjections:
    """The fused replacements for ``layers``, built once (a captured CUDA graph keeps
    reading the fused weights' addresses); :meth:`applied` swaps them in for a block.
    The fused weights are copies: extra memory the size of those projections."""

    def __init__(self, layers):
        self.swaps = []  # (owner, name, original, replacement)
        for layer in layers:
            for owner_name, names in GROUPS:
                owner = getattr(layer, owner_name, None)
                linears = [getattr(owner, n, None) for n in names]
                if owner is None or not _fusable(linears):
                    continue
                shared = _Shared(linears)
                for i, name in enumerate(names):
                    self.swaps.append((owner, name, linears[i], _Lead(shared) if i == 0 else _Follower(shared, i - 1)))

    @contextlib.contextmanager
    def applied(self):
        """Inside the block the layers run the fused products; the originals come back on exit."""
        for owner, name, _, replacement in self.swaps:
            setattr(owner, name, replacement)
        try:
            yield
        finally:
            for owner, name, original, _ in self.swaps:
                setattr(owner, name, original)
