"""One rank of a test job, started by torchrun: tiny target, ``dflash_train.distributed.launch.run``.

    dist_worker.py JOB_DIR TARGET_RANKS DRAFTER_RANKS GRAD_ACCUM MAX_STEPS [train.key=value ...]

``SLOW=rank:seconds`` makes global rank ``rank`` sleep that long in every training step (a
slower GPU); every rank then prints ``CLOCK`` lines with its LR and training clock per step.

Fault injection through the environment: ``CRASH=rank:step:how[:marker]`` makes global
rank ``rank`` die when its trainer starts step ``step`` (drafter/colocated ranks) or its
target server computes its ``step``-th micro-batch (target ranks); ``how`` is ``exit``
(os._exit(3)) or ``kill`` (SIGKILL). With a marker file it crashes only once. ``HANG=rank:step`` makes global rank ``rank`` stop
making progress (sleep forever) at that step, as a deadlocked rank does.
``EMULATE_EAGER_NCCL=1`` applies torch's process-group rule of an eagerly initialized NCCL job
(``eager_split.py``), so a group creation that hangs on GPUs fails here.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # dist_helpers, testkit

from dist_helpers import job, tiny_target  # noqa: E402

from dflash_train.config import config_from_dict  # noqa: E402
from dflash_train.distributed import disagg  # noqa: E402
from dflash_train.distributed.launch import run  # noqa: E402
from dflash_train.train.trainer import Trainer  # noqa: E402


def crash_now(how: str, marker: str | None) -> None:
    if marker:
        if Path(marker).exists():
            return
        Path(marker).write_text("crashed once")
    print(f"CRASHING rank {os.environ['RANK']} at {time.time():.3f}", flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


def install_crash(spec: str) -> None:
    rank, step, how, *marker = spec.split(":", 3)
    if int(os.environ["RANK"]) != int(rank):
        return
    marker = marker[0] if marker else None
    step = int(step)
    train_step = Trainer.train_step

    def crashing_step(self, micro_batches):
        if self.counters.step == step:
            crash_now(how, marker)
        return train_step(self, micro_batches)

    Trainer.train_step = crashing_step
    compute = disagg.TargetServer._compute
    calls = []

    def crashing_compute(self, *args):
        calls.append(1)
        if len(calls) == step:
            crash_now(how, marker)
        return compute(self, *args)

    disagg.TargetServer._compute = crashing_compute


def hang_forever() -> None:
    print(f"HANGING rank {os.environ['RANK']}", flush=True)
    while True:
        time.sleep(1)


def install_hang(spec: str) -> None:
    rank, step = (int(v) for v in spec.split(":"))
    if int(os.environ["RANK"]) != rank:
        return
    train_step = Trainer.train_step

    def hanging_step(self, micro_batches):
        if self.counters.step == step:
            hang_forever()
        return train_step(self, micro_batches)

    Trainer.train_step = hanging_step


def install_slow(spec: str) -> None:
    rank, seconds = spec.split(":")
    me = int(os.environ["RANK"])
    train_step = Trainer.train_step

    def slow_step(self, micro_batches):
        if me == int(rank):
            time.sleep(float(seconds))
        out = train_step(self, micro_batches)
        print(f"CLOCK rank {me} step {self.counters.step} lr {self.scheduler.get_last_lr()[0]!r} "
              f"seconds {self.counters.train_seconds!r}", flush=True)
        return out

    Trainer.train_step = slow_step


def main() -> None:
    folder, targets, drafters, accum, steps, *overrides = sys.argv[1:]
    if os.environ.get("CRASH"):
        install_crash(os.environ["CRASH"])
    if os.environ.get("HANG"):
        install_hang(os.environ["HANG"])
    if os.environ.get("EMULATE_EAGER_NCCL"):
        import eager_split

        eager_split.install()
    if os.environ.get("SLOW"):
        install_slow(os.environ["SLOW"])
    extra, sections = {}, {"data": {}, "objective": {}}
    for item in overrides:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        sections.get(section, extra)[name] = yaml.safe_load(value)
    cfg = job(Path(folder), grad_accum=int(accum), max_steps=int(steps), **extra)
    for section, keys in sections.items():
        cfg[section].update(keys)
    cfg = config_from_dict(cfg)
    summary = run(cfg, target=tiny_target, target_ranks=int(targets), drafter_ranks=int(drafters))
    print(f"EXITED rank {os.environ['RANK']} steps {summary.get('steps')}", flush=True)


if __name__ == "__main__":
    main()
