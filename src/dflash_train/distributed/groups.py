"""Every process group of a job, created in one place, in one order, on every rank.

Why one place: creating a process group is a collective over the WHOLE job. Under an
eagerly initialized NCCL default group (``init_process_group(device_id=...)``, which we use
so that NCCL communicators are ready before the first step), torch builds a sub-group's NCCL
communicator by ``ncclCommSplit`` of the default one: the members call it with their colour
and every NON-member calls it too, with no colour (``perform_nocolor_split`` in
``torch.distributed.distributed_c10d._new_process_group_helper``). A member of a sub-group
whose backend is NOT the default's (say, a separate gloo group for control messages) makes
no split at all, while the non-members still do: they then wait forever inside ``new_group``
for a split the members never join. That is how the disaggregated topology hung on its first
GPU run (the target rank in ``new_group(backend="gloo")``, the drafter at its next barrier).

The rule that keeps every rank's sequence of collectives identical:

* the default group carries BOTH backends, ``cpu:gloo,cuda:nccl`` on GPUs (``gloo`` on CPU):
  a CUDA tensor goes over NCCL, a CPU tensor over gloo, on the same group;
* every sub-group is created with the default backend (never an explicit other one), by
  every rank, here, right after initialization. Members and non-members then make matching
  splits, whatever the backend, and the control messages of the drafter ranks (a tiny CPU
  all-reduce per step that must never wait for the GPU) use the drafter group's gloo part.

``tests/distributed/eager_split.py`` enforces torch's splitting rule on CPU, so the gloo
tests take the same path an NCCL job takes and fail on any group that would hang there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def default_backend(device: torch.device) -> str:
    """The backend string of the default group: both backends on GPUs (see the module doc)."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


@dataclass
class Groups:
    """The groups a rank uses. ``drafters`` is the drafter ranks' data-parallel group (None on a
    target rank, which is not a member); ``control`` carries the drafters' per-step CPU
    agreement (stop flag, clock): the same group, its gloo part."""

    world: object
    drafters: object | None

    @property
    def control(self):
        return self.drafters


def build_groups(drafter_ranks: list[int], world: int, rank: int) -> Groups:
    """Create the job's groups; EVERY rank must call this, in the same place of its start-up.

    Colocated (every rank a drafter): the default group is the drafters' group, nothing is
    created. Disaggregated: one sub-group over the drafter ranks, created by all ranks.
    """
    if not dist.is_initialized() or len(drafter_ranks) == world:
        return Groups(world=dist.group.WORLD, drafters=dist.group.WORLD)
    drafters = dist.new_group(ranks=drafter_ranks)  # the default backend: see the module doc
    return Groups(world=dist.group.WORLD, drafters=drafters if rank in drafter_ranks else None)
