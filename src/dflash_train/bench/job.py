"""What ``dflash-train bench`` times: a job config, and the benchmark's own options.

The step comes from a job config exactly as ``dflash-train train`` reads one (a recipe or a file,
then ``section.key=value`` overrides): the drafter (kind, layers, block, feature layers, options), the
whole ``objective:`` section, ``optim:``, ``train:`` (anchors, attention, compilation, CUDA-graph step,
FP8 drafter, checkpointing, data parallelism) and ``target:`` (dtype, FP8 linears, compilation), put
together by the trainer's own assembly (``train/assembly.py``). So anything a job can set, the bench
can time, and a bench line is a training line with the data replaced by synthetic rows.

The options are what a job has no key for: the synthetic rows (``seq_len``, ``batch_size``), the clock
(``steps``, ``warmup``, ``profile_steps``, ``kernels``, ``matmul_size``) and the device. ``target.path``
may name a synthetic shape (``SHAPES``: random weights built on the device, no download; the flag
``--target-config`` writes it), else it is loaded like a training target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dflash_train.config import JobConfig, load_config

# Target shapes built with random weights (bench/run.build_target): the reference Qwen3-8B, the
# Qwen3-30B-A3B mixture of experts, and two tiny ones for CPU tests.
SHAPES = ("qwen3-8b", "qwen3-30b-a3b", "tiny", "tiny-moe")
# Without a recipe: the package defaults (the paper's 5-layer B = 16 drafter, 512 anchors) on the
# reference shape, at its 3,072-token rows, with the eager step. That is what the command lines written
# before the bench read a job config timed (docs/results quotes them), so they time the same step now.
WITHOUT_RECIPE = ("target.path=qwen3-8b", "data.max_length=3072", "train.cuda_graph_step=false")
TINY_SEQ_LEN = 128  # the tiny shapes' default row


def bench_job(recipe: str | None, overrides: list[str] = (), target_config: str | None = None) -> JobConfig:
    """The job a bench times: ``recipe`` (a recipe name or a file; None: ``WITHOUT_RECIPE``), then
    ``overrides``, then ``target_config`` as ``target.path``. Only the sections a step is built from
    are validated: the bench reads no data set and evaluates nothing."""
    base = [] if recipe else list(WITHOUT_RECIPE)
    shape = [f"target.path={json.dumps(target_config)}"] if target_config else []  # JSON text is YAML
    return load_config(recipe, [*base, *overrides, *shape], step_only=True)


@dataclass
class BenchOptions:
    """The benchmark's own settings (each is a flag of ``dflash-train bench``)."""

    seq_len: int | None = None  # tokens per synthetic row (None: 128 on a tiny shape, else data.max_length)
    batch_size: int = 1  # rows per micro-batch (train.grad_accum micro-batches per step)
    steps: int = 10  # timed steps
    warmup: int = 3  # untimed steps before them (the first compiles)
    profile_steps: int | None = None  # steps of the synchronized pass timing each phase (None: min(steps, 3))
    matmul_size: int | None = None  # the MFU ceiling's square matmul (None: 8192 on CUDA, 1024 on the CPU)
    kernels: int = 0  # > 0: one more step under torch.profiler, each phase's top N kernels (bench/kernels.py)
    device: str | None = None  # None: train.device
    prompt_len: int = 16  # leading tokens of each row with loss_mask 0

    def resolved(self, job: JobConfig) -> BenchOptions:
        """Every None filled from the job; ``ValueError`` naming the flag for a value no step can take."""
        tiny = job.target.path.startswith("tiny")
        seq_len = self.seq_len or (TINY_SEQ_LEN if tiny else job.data.max_length)
        out = BenchOptions(seq_len, self.batch_size, self.steps, self.warmup,
                           self.profile_steps if self.profile_steps is not None else min(self.steps, 3),
                           self.matmul_size, self.kernels, self.device or job.train.device,
                           min(self.prompt_len, max(0, seq_len - job.drafter.block_size - 2)))
        out.validate(job.drafter.block_size)
        return out

    def validate(self, block_size: int) -> None:
        for name in ("seq_len", "batch_size", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"bench: --{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "profile_steps", "kernels"):
            if getattr(self, name) < 0:
                raise ValueError(f"bench: --{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.seq_len <= block_size + 2:
            raise ValueError(f"bench: --seq-len {self.seq_len} must exceed drafter.block_size + 2 "
                             f"({block_size + 2})")
