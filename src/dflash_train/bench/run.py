"""The training-step benchmark: N steps of one job config on synthetic data.

What is timed is the trainer's own step, built by the trainer's own assembly from the job config
(``train/assembly.py``; ``bench/job.py`` says which config): anchors sampled on the CPU,
host-to-device copies, blocks, the objective's weights and targets, ``Target.features``,
``drafter_loss`` under bf16 autocast, backward, acceptance statistics, grad clipping with the
on-device non-finite check, the optimizer's step, the LR scheduler. Only the data differ: synthetic
micro-batches (``train.grad_accum`` per step) instead of a tokenized set. The drafter is wrapped as the
trainer wraps it (FP8 projections, activation checkpointing, per-layer ``torch.compile``, DDP or
FSDP2 under torchrun). Where ``train.cuda_graph_step`` holds and the trainer would graph the step
(one CUDA process, ...: ``Assembled.graph_step``), the step replays as one CUDA graph after two
eager warm-up steps; the profiled pass is then skipped (a replay has no phase boundaries).

Timing:

* the MAIN timed loop runs ``steps`` steps back to back with one
  ``torch.cuda.synchronize()`` before and one after: no syncs inside, so CPU/GPU
  overlap is what training gets. Throughput, TFLOP/s and MFU come from it;
* the warm-up steps (``warmup``) are synchronized and timed one by one; the first
  one (``first_step_s``) carries torch.compile / flex / autotuning costs;
  ``compile_s`` is dynamo's own count of it (``compile_breakdown_s``: tracing, forward and
  backward graphs, waiting for Triton), ``compile_cache`` the state of the persistent
  inductor cache when the run started (``empty`` or ``warm``);
* the PHASE times come from a separate "profiled" pass of ``profile_steps`` steps run
  after the timed loop, with ``torch.cuda.synchronize()`` at every phase boundary
  (prepare, target forward, drafter forward + loss, backward, optimizer). Their sum is
  the profiled step time, a little above the timed step time since the syncs remove
  the overlap of CPU launch work with GPU execution;
* ``--kernels N`` adds ``kernels``: one more step under ``torch.profiler``, each phase's device time
  by kernel category and its top N kernels (``bench/kernels.py``), after everything else is measured;
* ``peak_memory_gib`` is ``torch.cuda.max_memory_allocated`` over the timed and
  profiled steps (the stats are reset after warm-up);
* ``recompiles_after_warmup`` counts graphs Dynamo compiled after warm-up
  (``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` before/after): with
  static shapes it must be 0.

Under torchrun (``WORLD_SIZE`` > 1) every rank runs the same colocated step on its own
synthetic batches with the drafter wrapped in DDP, or FSDP2 with ``train.fsdp_drafter`` (the
trainer's colocated layout), so ``torchrun --nproc-per-node N -m dflash_train.cli bench``
measures N-GPU scaling. ``context_tokens_per_s`` is then the total over ranks (each rank's
tokens over the SLOWEST rank's timed loop), ``*_per_gpu`` fields divide it by N, and MFU is
per GPU. Rank 0 prints the JSON.

MFU divides the model FLOPs (:mod:`dflash_train.bench.flops`) per second by a matmul
ceiling measured in the same process: a square bf16 matmul (8192^3) on CUDA, an fp32
one on the CPU.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from dflash_train.bench.flops import Shape, step_flops
from dflash_train.bench.job import SHAPES, BenchOptions
from dflash_train.bench.kernels import profile_step
from dflash_train.config import JobConfig, TargetConfig
from dflash_train.data.batching import MicroBatch
from dflash_train.devices import resolve_device, synchronize
from dflash_train.models.target import Target
from dflash_train.train import compilation
from dflash_train.train.assembly import Assembled, assemble, load_target, target_dtype
from dflash_train.train.parallelize import DataParallel
from dflash_train.train.step import TrainStep
from dflash_train.train.trainer import RankInfo

QWEN3_8B_CONFIG = dict(
    hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=40960,
)
# A Qwen3-30B-A3B-shaped mixture of experts (128 experts, 8 active, 3B active of 30B parameters)
QWEN3_30B_A3B_CONFIG = dict(
    hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
    intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
    norm_topk_prob=True, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=40960,
)
NO_LOOKUPS = {name: dict.fromkeys(compilation.OUTCOMES, 0) for name, _, _ in compilation.CACHES}
PHASES = ("prepare", "target_forward", "drafter_forward", "backward", "optimizer")


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``: some torch versions reject an index-less CUDA device."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


# -- models --------------------------------------------------------------------------------
def build_target(name: str, device: torch.device, dtype: torch.dtype) -> Target:
    """A random-weight target built directly on ``device`` (``qwen3-8b``, the MoE ``qwen3-30b-a3b``,
    ``tiny``, ``tiny-moe``: random weights cost the FLOPs real ones do), or a model folder."""
    if name in ("tiny", "tiny-moe"):
        from dflash_train.models.tiny import tiny_qwen3, tiny_qwen3_moe

        build = tiny_qwen3 if name == "tiny" else tiny_qwen3_moe
        return Target(build(num_layers=8).to(device=device, dtype=dtype))
    if name in ("qwen3-8b", "qwen3-30b-a3b"):
        from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

        dense = name == "qwen3-8b"
        config = Qwen3Config(**QWEN3_8B_CONFIG) if dense else Qwen3MoeConfig(**QWEN3_30B_A3B_CONFIG)
        with torch.device(device):  # random init on the GPU: no CPU init and copy
            model = (Qwen3ForCausalLM if dense else Qwen3MoeForCausalLM)._from_config(config, dtype=dtype)
        return Target(model.to(device))
    return Target.load(name, dtype, device)


def bench_target(cfg: TargetConfig, device: torch.device, dtype: torch.dtype, log) -> Target:
    """``target.path``: a synthetic shape (``bench/job.SHAPES``, random weights; ``target.fp8_linear``
    converts its linears here, emulated in float32 on the CPU: the plumbing runs, the times mean nothing),
    else the job's target loaded as the trainer loads it."""
    if cfg.path not in SHAPES:
        return load_target(cfg, device, dtype)
    target = build_target(cfg.path, device, dtype)
    if cfg.fp8_linear:
        names = target.use_fp8_linears(emulate=device.type == "cpu")
        where = "emulated in float32 (no FP8 matmuls on the CPU)" if device.type == "cpu" else "torch._scaled_mm"
        log(f"target: {len(names)} decoder-layer linears in FP8 e4m3, rowwise scales, {where}")
    return target


def _fp8_linears(target: Target) -> int:
    from dflash_train.models.fp8 import FP8Linear

    return sum(isinstance(m, FP8Linear) for m in target.modules())


def _fp8_training_linears(drafter) -> int:
    from dflash_train.models.fp8 import FP8TrainingLinear

    return sum(isinstance(m, FP8TrainingLinear) for m in drafter.modules())


# -- the step: the trainer's own (train/assembly.py), on synthetic micro-batches ----------------
def synthetic_batch(opts: BenchOptions, seed: int, vocab: int, index: int, rank: int = 0) -> MicroBatch:
    """Micro-batch ``index`` of this rank: random token ids filling seq_len; loss_mask 1 except the
    first prompt_len tokens."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index * 1009 + rank)
    input_ids = torch.randint(0, vocab, (opts.batch_size, opts.seq_len), generator=g)
    loss_mask = torch.ones(opts.batch_size, opts.seq_len, dtype=torch.long)
    loss_mask[:, : opts.prompt_len] = 0
    attention_mask = torch.ones(opts.batch_size, opts.seq_len, dtype=torch.long)
    sample_ids = torch.arange(opts.batch_size) + index * opts.batch_size
    return MicroBatch(input_ids, loss_mask, attention_mask, sample_ids, epoch=0)


def _noop(_phase: str) -> None:
    pass


def _achieved_tflops(matmul, flops: int, device: torch.device, seconds: float) -> float:
    """TFLOP/s of ``matmul()`` (``flops`` each call), repeated for about ``seconds`` after warming up."""
    for _ in range(3):
        matmul()
    synchronize(device)
    start = time.perf_counter()
    matmul()
    synchronize(device)
    one = max(time.perf_counter() - start, 1e-6)
    iters = max(3, min(200, int(seconds / one)))
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(iters):
            matmul()
        end.record()
        torch.cuda.synchronize(device)
        elapsed = begin.elapsed_time(end) / 1e3
    else:
        start = time.perf_counter()
        for _ in range(iters):
            matmul()
        elapsed = time.perf_counter() - start
    return flops * iters / elapsed / 1e12


def matmul_ceiling(device: torch.device, size: int, dtype: torch.dtype, seconds: float = 0.5) -> float:
    """Achieved TFLOP/s of a square ``size``^3 matmul (the MFU denominator)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return _achieved_tflops(lambda: a @ b, 2 * size**3, device, seconds)


def fp8_matmul_ceiling(device: torch.device, size: int, seconds: float = 0.5) -> float:
    """Achieved TFLOP/s of a square ``size``^3 e4m3 matmul with rowwise scales and a bf16 output, the
    product ``FP8Linear`` runs: the second MFU denominator of an FP8 run (its matmuls could at best
    go this fast; the bf16 ceiling understates how far an FP8 run is from its hardware limit)."""
    from dflash_train.models.fp8 import quantize_rows, scaled_mm

    qa, scale_a = quantize_rows(torch.randn(size, size, device=device, dtype=torch.bfloat16))
    qw, scale_w = quantize_rows(torch.randn(size, size, device=device, dtype=torch.bfloat16))
    scale_w = scale_w.reshape(1, -1).contiguous()
    return _achieved_tflops(lambda: scaled_mm(qa, scale_a, qw, scale_w), 2 * size**3, device, seconds)


def _dynamo_graphs() -> int:
    try:
        from torch._dynamo.utils import counters
    except Exception:  # pragma: no cover
        return 0
    return int(counters["stats"]["unique_graphs"])


def _log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _init_distributed(opts: BenchOptions):
    """Under torchrun: the process group and this rank's device (cuda:LOCAL_RANK)."""
    from dflash_train.distributed.env import init_from_env, launched_by_torchrun

    if not launched_by_torchrun() or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    env = init_from_env(opts.device)
    opts.device = str(env.device)
    return env


def _across_ranks(value: float, device: torch.device, world: int, op: str = "max") -> float:
    """``value`` reduced over ranks (``max`` or ``sum``); itself in one process."""
    if world < 2:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(t)


def run_bench(job: JobConfig, opts: BenchOptions, log=_log, test_capture=None, target: Target | None = None) -> dict:
    """Build everything, run warm-up, timed and profiled steps; return the result dict.

    ``job``: the job config whose step is timed (``bench/job.bench_job``); ``opts``: the bench's own.
    Under torchrun the process group is set up here and torn down before returning.
    ``test_capture(step) -> capture``: a stand-in for the CUDA capture of ``train.cuda_graph_step``
    (CPU tests; ``train/cuda_graphs.GraphedStep`` says what a capture must do); ``target``: a target
    built elsewhere (tests), instead of ``target.path``'s."""
    from dflash_train.distributed.env import shutdown

    opts = opts.resolved(job)
    env = _init_distributed(opts)
    if env is None:
        return _run_bench(job, opts, env, log, test_capture, target)
    try:
        result = _run_bench(job, opts, env, log, target=target)
    except BaseException:
        shutdown(clean=False)  # no barrier: the other ranks may be inside a collective
        raise
    shutdown()
    return result


def _run_bench(job: JobConfig, opts: BenchOptions, env, log, test_capture=None, target=None) -> dict:
    world, rank = (env.world, env.rank) if env is not None else (1, 0)
    bench = StepBench.build(job, opts, world, rank, log if rank == 0 else _noop, test_capture, target)
    warmup_times = bench.warm_up()
    timed = bench.timed()
    phases = bench.profiled()
    report = bench.report(warmup_times, timed, phases)
    if opts.kernels:
        report["kernels"] = bench.kernel_breakdown()
    return report


@dataclass
class Ceiling:
    """The MFU denominators, measured in this process: a square matmul's achieved TFLOP/s, and for a
    run with FP8 linears (``--target-fp8``/``--drafter-fp8``) the same product in FP8."""

    tflops: float
    size: int
    dtype: torch.dtype
    fp8_tflops: float | None = None

    @classmethod
    def measure(cls, device: torch.device, size: int | None, log, fp8: bool = False) -> Ceiling:
        from dflash_train.models.fp8 import native_fp8

        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        size = size or (8192 if device.type == "cuda" else 1024)
        tflops = matmul_ceiling(device, size, dtype)
        log(f"matmul ceiling {tflops:.1f} TFLOP/s ({size}^3 {dtype})")
        fp8_tflops = fp8_matmul_ceiling(device, size) if fp8 and native_fp8(device) else None
        if fp8_tflops is not None:
            log(f"FP8 matmul ceiling {fp8_tflops:.1f} TFLOP/s ({size}^3 e4m3, rowwise scales)")
        return cls(tflops, size, dtype, fp8_tflops)

    def describe(self) -> str:
        return f"{self.size}^3 {str(self.dtype).removeprefix('torch.')} matmul, measured"

    def report(self, achieved_tflops: float) -> dict:
        """The report's ceiling keys; the FP8 ones are null unless an FP8 ceiling was measured."""
        fp8 = self.fp8_tflops
        return {"matmul_ceiling_tflops": self.tflops, "matmul_ceiling": self.describe(),
                "mfu": achieved_tflops / self.tflops, "matmul_ceiling_fp8_tflops": fp8,
                "mfu_vs_fp8_ceiling": None if fp8 is None else achieved_tflops / fp8}


@dataclass
class TimedLoop:
    """The main timed loop's outcome (the slowest rank's time, every rank's kept blocks)."""

    seconds: float
    kept_blocks: int
    last_loss: float
    graphs_before: int  # dynamo's graph count when the loop started (recompiles are counted from here)


@dataclass
class StepBench:
    """The trainer's own step (``train/assembly.py``) on synthetic micro-batches, and the
    measurements of it: warm-up, the timed loop, the profiled pass, the report."""

    job: JobConfig
    opts: BenchOptions
    world: int
    rank: int
    parts: Assembled
    step: TrainStep
    batches: list[list[MicroBatch]]  # per step: train.grad_accum micro-batches
    ceiling: Ceiling
    cache: str
    build_s: float
    log: object = _noop

    @property
    def device(self) -> torch.device:
        return self.parts.device

    @classmethod
    def build(cls, job: JobConfig, opts: BenchOptions, world: int, rank: int, log, test_capture=None,
              target: Target | None = None) -> StepBench:
        """Target (``target``: one built elsewhere, as ``Trainer`` takes one), drafter (wrapped as the
        trainer wraps it) and step, timed as ``build_s``."""
        device = _indexed(resolve_device(opts.device, "bench --device"))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        ceiling = Ceiling.measure(device, opts.matmul_size, log, fp8=job.target.fp8_linear or job.train.fp8_drafter)
        cache = _compile_cache(job, device, log)
        t0 = time.perf_counter()
        target = target.to(device) if target is not None else bench_target(job.target, device, target_dtype(job, device), log)
        # the colocated trainer's data parallelism: one gradient all-reduce per step
        parallel = DataParallel(dist.group.WORLD, device, fsdp=job.train.fsdp_drafter) if world > 1 else None
        parts = assemble(job, target, device, parallel, log, emulate_fp8=device.type == "cpu")
        _describe(parts, log)
        synchronize(device)
        build_s = time.perf_counter() - t0
        log(f"built target + drafter in {build_s:.1f}s")
        total_steps = opts.warmup + opts.steps + opts.profile_steps
        ranks = RankInfo(rank, world, dist.group.WORLD if world > 1 else None)
        step = parts.step(total_steps, ranks)
        parts.graph_step(step, ranks, parallel, log, None if test_capture is None else test_capture(step))
        total_steps += 1 if opts.kernels else 0  # --kernels' step: a batch, not a longer LR schedule
        per_step, vocab = job.train.grad_accum, target.facts.vocab_size
        batches = [[synthetic_batch(opts, job.train.seed, vocab, i * per_step + j, rank) for j in range(per_step)]
                   for i in range(total_steps)]
        return cls(job, opts, world, rank, parts, step, batches, ceiling, cache, build_s, log)

    def train_step(self, index: int, mark=_noop):
        layer_ids = list(self.parts.drafter_cfg.target_layer_ids)
        final_hidden = self.step.opts.needs_target_distribution  # kl/tv: the target's last hidden states too

        def features(mb, ids, attention):
            return self.parts.target.features(ids, attention, layer_ids, final_hidden=final_hidden)

        return self.step(self.batches[index], features, index + 1, mark)

    def warm_up(self) -> list[float]:
        """The warm-up steps, synchronized and timed one by one (the first carries compilation)."""
        times = []
        for i in range(self.opts.warmup):
            synchronize(self.device)
            start = time.perf_counter()
            self.train_step(i)
            synchronize(self.device)
            times.append(time.perf_counter() - start)
            self.log(f"warm-up step {i + 1}: {times[-1]:.2f}s")
        if not times:  # the first timed step carries the compile; say so
            self.log("no warm-up: the timed steps include compilation")
        return times

    def timed(self) -> TimedLoop:
        """``steps`` steps back to back: one sync before, one after, none inside."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        graphs_before = _dynamo_graphs()
        kept_blocks, losses = 0, []
        synchronize(self.device)
        if self.world > 1:  # every rank starts its timed loop together
            dist.barrier()
        start = time.perf_counter()
        for i in range(self.opts.warmup, self.opts.warmup + self.opts.steps):
            result = self.train_step(i)
            losses.append(result.loss)
            kept_blocks += result.kept_blocks
        synchronize(self.device)
        seconds = _across_ranks(time.perf_counter() - start, self.device, self.world)  # the slowest rank's loop
        kept_blocks = int(_across_ranks(kept_blocks, self.device, self.world, op="sum"))
        return TimedLoop(seconds, kept_blocks, float(losses[-1]) if losses else math.nan, graphs_before)

    def profiled(self) -> dict | None:
        """Seconds per phase of a separate pass of ``profile_steps`` steps, synchronized at every
        phase boundary (None: the step is one CUDA graph, no boundaries to time)."""
        totals = dict.fromkeys(PHASES, 0.0)
        if not self.opts.profile_steps:
            return totals
        if self.step.graph is not None:
            return None
        clock = {"t": 0.0}

        def mark(phase: str) -> None:
            synchronize(self.device)
            now = time.perf_counter()
            totals[phase] += now - clock["t"]
            clock["t"] = now

        begin = self.opts.warmup + self.opts.steps
        for i in range(begin, begin + self.opts.profile_steps):
            synchronize(self.device)
            clock["t"] = time.perf_counter()
            self.train_step(i, mark)
        return {k: v / self.opts.profile_steps for k, v in totals.items()}

    def kernel_breakdown(self) -> dict:
        """``--kernels N``: the step after the profiled pass under ``torch.profiler``, its kernels per
        phase (``bench/kernels.py``); run after the report's numbers, so it perturbs none of them."""
        index = self.opts.warmup + self.opts.steps + self.opts.profile_steps
        return profile_step(lambda mark: self.train_step(index, mark), self.device, synchronize, self.opts.kernels)

    def report(self, warmup_times: list[float], timed: TimedLoop, phases: dict | None) -> dict:
        """The JSON object ``dflash-train bench`` prints (its keys are read by tests and docs)."""
        opts, step = self.opts, self.step
        recompiles = _dynamo_graphs() - timed.graphs_before
        step_s = timed.seconds / opts.steps
        rows = opts.batch_size * self.job.train.grad_accum  # per rank and step
        tokens_per_step = rows * opts.seq_len * self.world
        achieved = self._flops().total * rows / step_s / 1e12  # per GPU
        drafted = timed.kept_blocks * self.parts.drafter_cfg.block_size
        return {
            "config": self._config(), "rank": self.rank, **self._machine(), "steps": opts.steps,
            "warmup": opts.warmup, "step_time_s": step_s, "context_tokens_per_step": tokens_per_step,
            "context_tokens_per_s": tokens_per_step / step_s, "world_size": self.world,
            "context_tokens_per_s_per_gpu": tokens_per_step / step_s / self.world,
            "drafted_positions_per_step": drafted / opts.steps, "drafted_positions_per_s": drafted / timed.seconds,
            "flops_per_context_token": self._flops().per_token,
            "gflops_per_context_token_breakdown": {k: v / 1e9 for k, v in self._flops().per_token_breakdown().items()},
            "achieved_tflops": achieved, **self.ceiling.report(achieved),
            "phase_seconds": phases, "profiled_step_s": sum(phases.values()) if phases and opts.profile_steps else None,
            "phase_timing": ("none: the step is one CUDA graph (train.cuda_graph_step)" if step.graph is not None else
                             f"separate profiled pass of {opts.profile_steps} step(s) after the timed loop, "
                             "synchronize at each phase boundary; the timed loop has no syncs"),
            "cuda_graph_step": None if step.graph is None else {
                "captured": step.graph.graph is not None, "replays": step.graph.replays,
                "eager_steps": step.graph.eager_steps},
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
            "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "build_s": self.build_s, "first_step_s": warmup_times[0] if warmup_times else None,
            **self._compile_report(), "warmup_step_s": warmup_times, "recompiles_after_warmup": recompiles,
            "dynamo_graphs_total": _dynamo_graphs(), "last_loss": timed.last_loss,
        }

    def _config(self) -> dict:
        """The job's step sections as timed (the drafter resolved against the target, as the trainer's
        ``config.json`` has it in ``drafter_resolved``), and ``bench``: the bench's own options with
        what they resolved to, and counts of what was built."""
        parts = self.parts
        job = {name: value for name, value in self.job.to_dict().items() if name not in ("data", "eval")}
        return {**job, "drafter": parts.drafter_cfg.to_dict(), "bench": {
            **asdict(self.opts), "target_config": self.job.target.path, "device": str(self.device),
            "dtype": str(parts.dtype).removeprefix("torch."), "attention": parts.spec.options(self.device).attention,
            "compiled": parts.compiled, "target_compiled": bool(getattr(parts.target, "layers_compiled", False)),
            "target_fp8_linears": _fp8_linears(parts.target), "drafter_fp8_linears": _fp8_training_linears(parts.drafter),
            "drafter_params": sum(p.numel() for p in parts.drafter.parameters())}}

    def _flops(self):
        opts, dcfg = self.opts, self.parts.drafter_cfg
        mean_anchor = (opts.prompt_len + opts.seq_len - 2) / 2  # anchors uniform over [prompt_len, S - 2]
        return step_flops(Shape.of(self.parts.target.facts), max(dcfg.target_layer_ids) + 1, Shape.of(dcfg),
                          dcfg.num_hidden_layers, len(dcfg.target_layer_ids), opts.seq_len,
                          self.job.train.num_anchors, dcfg.block_size, mean_anchor)

    def _machine(self) -> dict:
        cuda = self.device.type == "cuda"
        return {"device_name": torch.cuda.get_device_name(self.device) if cuda else "cpu",
                "torch_version": torch.__version__}

    def _compile_report(self) -> dict:
        compiled = self.parts.compiled
        hits = compilation.cache_report(NO_LOOKUPS) if compiled else {}  # this process's graphs: cache hit/miss
        return {"compile_cache": self.cache, **hits,
                "compile_s": compilation.compile_seconds()["total"] if compiled else 0.0,
                "compile_breakdown_s": compilation.compile_seconds() if compiled else {}}


def _compile_cache(job: JobConfig, device: torch.device, log) -> str:
    """The persistent inductor cache's state when the run starts (``empty``/``warm``; ``n/a``: nothing
    compiles, as ``train.compile`` runs on CUDA only)."""
    if not (job.train.compile and device.type == "cuda"):
        return "n/a"
    folder = compilation.use_persistent_cache()
    state = compilation.cache_state(folder)
    log(f"compile cache {state}: {folder}")
    return state


def _describe(parts: Assembled, log) -> None:
    """One line each for what the job changed in the modules: FP8 drafter projections, a compiled target."""
    if parts.cfg.train.fp8_drafter:
        cpu = parts.device.type == "cpu"
        where = "emulated in float32 (no FP8 matmuls on the CPU)" if cpu else "torch._scaled_mm"
        log(f"drafter: {_fp8_training_linears(parts.drafter)} projections with FP8 e4m3 forward and backward, {where}")
    if getattr(parts.target, "layers_compiled", False):
        log("target: decoder layers compiled (target.compile)")
