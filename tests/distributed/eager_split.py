"""Make a gloo job obey torch's process-group rule of an eagerly initialized NCCL job.

With ``init_process_group("nccl", device_id=...)`` torch creates every sub-group's NCCL
communicator by splitting the default one (``ncclCommSplit``, a collective over ALL ranks):
in ``torch.distributed.distributed_c10d._new_process_group_helper``, a rank that is NOT a
member of the new group calls ``perform_nocolor_split`` whatever the new group's backend,
while a member splits only when the new group uses the default (NCCL) backend. On CPU, gloo
makes no split, so a wrong group creation never shows. ``install()`` replaces
``torch.distributed.new_group`` with a version that performs that split as a real
collective over the job's store: each rank's n-th split waits for every rank's n-th split.
A rank left waiting fails after ``SPLIT_TIMEOUT_S`` with a message naming the group, instead
of hanging forever as it does on GPUs.

It also makes ``dist.get_backend()`` answer ``"nccl"`` for the default group when asked from
``dflash_train`` code, so code that branches on the backend takes its NCCL path.
"""

from __future__ import annotations

import sys
import time

import torch.distributed as dist

SPLIT_TIMEOUT_S = 20.0


class EagerSplitRule:
    def __init__(self):
        self.splits = 0
        self.real_new_group = dist.new_group
        self.real_get_backend = dist.get_backend

    def new_group(self, ranks=None, timeout=None, backend=None, *args, **kwargs):
        rank, world = dist.get_rank(), dist.get_world_size()
        members = list(range(world)) if ranks is None else sorted(ranks)
        if rank not in members or backend is None:  # torch's rule (see the module doc)
            self._split(rank, world, members, backend)
        return self.real_new_group(ranks, timeout, backend, *args, **kwargs)

    def _split(self, rank: int, world: int, members: list[int], backend) -> None:
        store = dist.distributed_c10d._get_default_store()
        key = f"eager-split/{self.splits}"
        self.splits += 1
        store.add(key, 1)
        deadline = time.monotonic() + SPLIT_TIMEOUT_S
        while store.add(key, 0) < world:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"eager-NCCL split rule: rank {rank} waits in communicator split #{self.splits - 1} "
                    f"(new_group(ranks={members}, backend={backend!r})) that not every rank joins: "
                    "on GPUs this hangs forever")
            time.sleep(0.01)

    def get_backend(self, group=None):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if group is None and caller.startswith("dflash_train"):
            return "nccl"
        return self.real_get_backend(group)


def install() -> EagerSplitRule:
    rule = EagerSplitRule()
    dist.new_group = rule.new_group
    dist.get_backend = rule.get_backend
    return rule
