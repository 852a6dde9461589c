"""Process-group set-up from torchrun's environment, and a clean shutdown.

torchrun sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` (and the rendezvous
``MASTER_ADDR``/``MASTER_PORT``); we only read them. The collective timeout comes from
``DFLASH_DIST_TIMEOUT`` (seconds, default 1800): a rank that dies or hangs makes the
others fail after at most that long even without torchrun tearing them down (torchrun
normally kills the survivors within a second of a worker's non-zero exit).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dflash_train.devices import resolve_device
from dflash_train.distributed.groups import default_backend

DEFAULT_TIMEOUT_S = 1800.0


@dataclass
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def comm_device(self) -> torch.device:
        """Where point-to-point / collective tensors of the data path live: the GPU (NCCL) when
        there is one, else the CPU (gloo)."""
        return self.device


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ and "LOCAL_RANK" in os.environ


def restart_count() -> int:
    """How many times torchrun (``--max-restarts``) has restarted this job's workers."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def timeout_seconds() -> float:
    return float(os.environ.get("DFLASH_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))


def init_from_env(device_name: str = "auto") -> DistEnv:
    """Initialize the default process group when torchrun started several workers.

    On GPUs the default group carries NCCL (CUDA tensors) and gloo (CPU tensors), eagerly
    initialized on ``cuda:LOCAL_RANK``; gloo alone on CPUs (``groups.default_backend``).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = resolve_device(device_name).type == "cuda"
    device = torch.device("cpu")
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    env = DistEnv(rank=rank, world=world, local_rank=local_rank, device=device)
    if world > 1 and not dist.is_initialized():
        env.backend = default_backend(device)
        kwargs = {"device_id": device} if use_cuda else {}
        timeout = datetime.timedelta(seconds=timeout_seconds())
        # torchrun's c10d rendezvous keeps ONE store across restarts (--max-restarts): without a
        # per-attempt prefix, restarted workers read the dead workers' gloo/NCCL addresses.
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        store = dist.PrefixStore(f"dflash/attempt-{restart_count()}", store)
        dist.init_process_group(env.backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs)
    elif dist.is_initialized():
        env.backend = dist.get_backend()
    return env


def shutdown(clean: bool = True) -> None:
    """Barrier then ``destroy_process_group`` (gloo processes can abort at exit otherwise)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if clean:
            dist.barrier()
    finally:
        dist.destroy_process_group()
