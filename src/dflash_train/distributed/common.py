"""The drafter ranks' per-step agreement: one tiny CPU all-reduce, never a GPU sync.

Ranks must make the same decisions after every step: stop or go on (DDP and checkpoints are
collective), evaluate or not, and the LR (which follows the time budget). ``AgreedRanks`` is
the trainer's rank layout with that agreement: after each step one all-reduce (MAX) of
[stop requested, signalled, training seconds] over the control group (the gloo part of the
drafter group, ``groups.py``), a host round-trip. A signal only raises this rank's own request;
the trainer stops on the AGREED flag, so a signal arriving between the all-reduce and the
loop's check can never make one rank stop alone. Each agreement is also this rank's
heartbeat for the watchdog.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dflash_train.distributed import watchdog
from dflash_train.train.trainer import RankInfo


@dataclass
class AgreedRanks(RankInfo):
    control: object = None  # a group whose CPU tensors travel over gloo

    def agree(self, step: int, stop: bool, signalled: bool, seconds: float) -> tuple[bool, bool, float]:
        message = torch.tensor([float(stop), float(signalled), seconds], dtype=torch.float64)
        dist.all_reduce(message, op=dist.ReduceOp.MAX, group=self.control)
        watchdog.beat(f"after step {step}", steady=True)
        return bool(message[0] > 0), bool(message[1] > 0), float(message[2])

    def expect_long(self, phase: str) -> None:
        watchdog.beat(phase, long=True)
