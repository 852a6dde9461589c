"""The training-step benchmark: N steps of one configuration on synthetic data.

What is timed is the trainer's own step (``train/step.py``'s ``TrainStep``, one micro-batch
per step): anchors sampled on the CPU, host-to-device copies, blocks, the global weight,
``Target.features``, ``drafter_loss`` under bf16 autocast, backward, acceptance statistics, grad
clipping with the on-device non-finite check, fused ``AdamW.step``, the LR scheduler. Only the
data differ: synthetic micro-batches instead of a tokenized set. The drafter is wrapped by the
trainer's ``parallelize_drafter`` (activation checkpointing, per-layer ``torch.compile``, DDP
under torchrun). ``--cuda-graph-step`` replays the step as one CUDA graph after two eager warm-up
steps, as the trainer does in one process (``train.cuda_graph_step``); the profiled pass is then
skipped (a replay has no phase boundaries to synchronize at).

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
* ``peak_memory_gib`` is ``torch.cuda.max_memory_allocated`` over the timed and
  profiled steps (the stats are reset after warm-up);
* ``recompiles_after_warmup`` counts graphs Dynamo compiled after warm-up
  (``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` before/after): with
  static shapes it must be 0.

Under torchrun (``WORLD_SIZE`` > 1) every rank runs the same colocated step on its own
synthetic batches with the drafter wrapped in DDP (the trainer's colocated layout, one
gradient all-reduce per step), so ``torchrun --nproc-per-node N -m dflash_train.cli bench``
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
from dflash_train.config import OptimConfig
from dflash_train.data.batching import MicroBatch
from dflash_train.devices import resolve_device, resolve_dtype, synchronize
from dflash_train.models.config import DrafterConfig, resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.models.target import Target, choose_mask_token_id
from dflash_train.objective.blocks import default_gamma
from dflash_train.objective.step import ObjectiveOptions
from dflash_train.train import compilation
from dflash_train.train.cuda_graphs import GraphedStep
from dflash_train.train.optim import build_optimizer, build_scheduler
from dflash_train.train.parallelize import DataParallel, parallelize_drafter
from dflash_train.train.step import Anchors, TrainStep
from dflash_train.train.trainer import RankInfo

QWEN3_8B_CONFIG = dict(
    hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=40960,
)
# Defaults that depend on the target: (seq_len, num_anchors)
REFERENCE_DEFAULTS = (3072, 512)
TINY_DEFAULTS = (128, 8)
PHASES = ("prepare", "target_forward", "drafter_forward", "backward", "optimizer")


@dataclass
class BenchConfig:
    target_config: str = "qwen3-8b"  # qwen3-8b | tiny | a HF model folder
    drafter_layers: int = 5
    block_size: int = 16
    target_layer_ids: list[int] | None = None  # None: the spec's default rule
    num_anchors: int | None = None  # None: 512 (8 for tiny)
    seq_len: int | None = None  # None: 3072 (128 for tiny)
    batch_size: int = 1
    steps: int = 10
    warmup: int = 3
    profile_steps: int | None = None  # None: min(steps, 3)
    attention: str = "auto"  # flex | sdpa | auto (flex on CUDA)
    compile: bool | None = None  # None: on CUDA only (as train.compile)
    loss_chunk_size: int = 4096
    device: str = "auto"
    dtype: str = "auto"  # bf16 on CUDA, fp32 on CPU
    checkpoint_drafter: bool = False
    prompt_len: int = 16  # leading tokens with loss_mask 0
    matmul_size: int | None = None  # None: 8192 on CUDA, 1024 on CPU
    seed: int = 0
    cuda_graph_step: bool = False  # replay the step as one CUDA graph, as the trainer does (one process)
    optim: str = "adamw"  # the optimizer the step runs (optim.name): adamw or muon

    def resolved(self) -> BenchConfig:
        out = BenchConfig(**asdict(self))
        seq, anchors = TINY_DEFAULTS if self.target_config == "tiny" else REFERENCE_DEFAULTS
        out.seq_len = out.seq_len or seq
        out.num_anchors = out.num_anchors or anchors
        device = resolve_device(out.device, "bench --device")
        out.device = str(device)
        if out.attention == "auto":
            out.attention = "flex" if device.type == "cuda" else "sdpa"
        if out.compile is None:
            out.compile = device.type == "cuda"
        out.dtype = str(resolve_dtype(out.dtype, device)).removeprefix("torch.")
        if out.profile_steps is None:
            out.profile_steps = min(out.steps, 3)
        out.prompt_len = min(out.prompt_len, max(0, out.seq_len - out.block_size - 2))
        out.validate()
        return out

    def validate(self) -> None:
        for name in ("drafter_layers", "block_size", "num_anchors", "seq_len", "batch_size", "steps",
                     "loss_chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"bench: --{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.profile_steps < 0:
            raise ValueError("bench: --warmup and --profile-steps must be >= 0")
        if self.attention not in ("flex", "sdpa"):
            raise ValueError(f"bench: --attention must be flex/sdpa/auto, got {self.attention!r}")
        if self.attention == "flex" and not self.device.startswith("cuda"):
            raise ValueError("bench: --attention flex has no CPU backward; use --attention sdpa")
        if self.seq_len <= self.block_size + 2:
            raise ValueError(f"bench: --seq-len {self.seq_len} must exceed --block-size + 2")


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``: some torch versions reject an index-less CUDA device."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


# -- models --------------------------------------------------------------------------------
def build_target(name: str, device: torch.device, dtype: torch.dtype) -> Target:
    """Random-weight Qwen3-8B-shaped target built directly on ``device``, tiny, or a folder."""
    if name == "tiny":
        from dflash_train.models.tiny import tiny_qwen3

        return Target(tiny_qwen3(num_layers=8).to(device=device, dtype=dtype))
    if name == "qwen3-8b":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(**QWEN3_8B_CONFIG)
        with torch.device(device):  # random init on the GPU: no 16 GB CPU init and copy
            model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
        return Target(model.to(device))
    return Target.load(name, dtype, device)


def build_drafter(target: Target, cfg: BenchConfig, device: torch.device, data_parallel=None):
    """(drafter, the module a step calls, its resolved config), wrapped as the trainer wraps it."""
    mask_id, _ = choose_mask_token_id(target.tokenizer, target.facts.vocab_size)
    dcfg = resolve_drafter_config(
        DrafterConfig(num_hidden_layers=cfg.drafter_layers, block_size=cfg.block_size,
                      target_layer_ids=cfg.target_layer_ids),
        target.facts, mask_id,
    )
    target.validate_layer_ids(dcfg.target_layer_ids)
    torch.manual_seed(cfg.seed)
    with torch.device(device):  # fp32 master weights, as the trainer
        drafter = DFlashDrafter(dcfg)
    drafter = drafter.to(device)
    # the trainer's own wrapping: checkpoint-wrap each layer, compile each wrapped layer, DDP
    model = parallelize_drafter(drafter, cfg.checkpoint_drafter, cfg.compile, data_parallel)
    return drafter, model, dcfg


# -- the step: the trainer's own (train/step.py), on synthetic micro-batches ----------------
def synthetic_batch(cfg: BenchConfig, vocab: int, step: int, rank: int = 0) -> MicroBatch:
    """Random token ids filling seq_len; loss_mask 1 except the first prompt_len tokens."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 1009 + rank)
    input_ids = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=g)
    loss_mask = torch.ones(cfg.batch_size, cfg.seq_len, dtype=torch.long)
    loss_mask[:, : cfg.prompt_len] = 0
    attention_mask = torch.ones(cfg.batch_size, cfg.seq_len, dtype=torch.long)
    sample_ids = torch.arange(cfg.batch_size) + step * cfg.batch_size
    return MicroBatch(input_ids, loss_mask, attention_mask, sample_ids, epoch=0)


def _noop(_phase: str) -> None:
    pass


def matmul_ceiling(device: torch.device, size: int, dtype: torch.dtype, seconds: float = 0.5) -> float:
    """Achieved TFLOP/s of a square ``size``^3 matmul (the MFU denominator)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    a @ b
    synchronize(device)
    one = max(time.perf_counter() - start, 1e-6)
    iters = max(3, min(200, int(seconds / one)))
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(iters):
            a @ b
        end.record()
        torch.cuda.synchronize(device)
        elapsed = begin.elapsed_time(end) / 1e3
    else:
        start = time.perf_counter()
        for _ in range(iters):
            a @ b
        elapsed = time.perf_counter() - start
    return 2 * size**3 * iters / elapsed / 1e12


def _dynamo_graphs() -> int:
    try:
        from torch._dynamo.utils import counters
    except Exception:  # pragma: no cover
        return 0
    return int(counters["stats"]["unique_graphs"])


def _log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _init_distributed(cfg: BenchConfig):
    """Under torchrun: the process group and this rank's device (cuda:LOCAL_RANK)."""
    from dflash_train.distributed.env import init_from_env, launched_by_torchrun

    if not launched_by_torchrun() or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    env = init_from_env(cfg.device)
    cfg.device = str(env.device)
    return env


def _across_ranks(value: float, device: torch.device, world: int, op: str = "max") -> float:
    """``value`` reduced over ranks (``max`` or ``sum``); itself in one process."""
    if world < 2:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(t)


def run_bench(cfg: BenchConfig, log=_log, test_capture=None) -> dict:
    """Build everything, run warm-up, timed and profiled steps; return the result dict.

    Under torchrun the process group is set up here and torn down before returning.
    ``test_capture(step) -> capture``: a stand-in for the CUDA capture of ``--cuda-graph-step``
    (CPU tests; ``train/cuda_graphs.GraphedStep`` says what a capture must do)."""
    from dflash_train.distributed.env import shutdown

    if cfg.cuda_graph_step and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("bench: --cuda-graph-step runs in one process (the trainer graphs no DDP step)")
    env = _init_distributed(cfg)
    if env is None:
        return _run_bench(cfg, env, log, test_capture)
    try:
        result = _run_bench(cfg, env, log)
    except BaseException:
        shutdown(clean=False)  # no barrier: the other ranks may be inside a collective
        raise
    shutdown()
    return result


def _run_bench(cfg: BenchConfig, env, log, test_capture=None) -> dict:
    cfg = cfg.resolved()
    if cfg.cuda_graph_step and not cfg.device.startswith("cuda") and test_capture is None:
        raise ValueError("bench: --cuda-graph-step needs a CUDA device")
    world, rank = (env.world, env.rank) if env is not None else (1, 0)
    if rank != 0:
        log = _noop
    device = _indexed(resolve_device(cfg.device, "bench --device"))
    dtype = getattr(torch, cfg.dtype)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    ceiling_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ceiling_size = cfg.matmul_size or (8192 if device.type == "cuda" else 1024)
    ceiling = matmul_ceiling(device, ceiling_size, ceiling_dtype)
    log(f"matmul ceiling {ceiling:.1f} TFLOP/s ({ceiling_size}^3 {ceiling_dtype})")

    cache = "n/a"
    if cfg.compile:
        folder = compilation.use_persistent_cache()
        cache = compilation.cache_state(folder)
        log(f"compile cache {cache}: {folder}")
    t0 = time.perf_counter()
    target = build_target(cfg.target_config, device, dtype)
    # the colocated trainer's data parallelism: one gradient all-reduce per step
    parallel = DataParallel(dist.group.WORLD, device) if world > 1 else None
    drafter, model, dcfg = build_drafter(target, cfg, device, parallel)
    synchronize(device)
    build_s = time.perf_counter() - t0
    log(f"built target + drafter in {build_s:.1f}s; target layers {dcfg.target_layer_ids}")

    optim_cfg = OptimConfig(name=cfg.optim)
    optim_cfg.validate()
    optimizer = build_optimizer(drafter, optim_cfg, fused=device.type in ("cuda", "cpu"))
    total_steps = cfg.warmup + cfg.steps + cfg.profile_steps
    scheduler = build_scheduler(optimizer, optim_cfg, total_steps)
    opts = ObjectiveOptions(block_size=cfg.block_size, mask_token_id=dcfg.mask_token_id,
                            gamma=default_gamma(cfg.block_size), attention=cfg.attention,
                            loss_chunk_size=cfg.loss_chunk_size, compiled_loss=bool(cfg.compile))
    ranks = RankInfo(rank, world, dist.group.WORLD if world > 1 else None)
    step = TrainStep(model, drafter, target, optimizer, scheduler, opts,
                     Anchors("random", cfg.num_anchors, cfg.seed, cfg.block_size), optim_cfg.grad_clip,
                     device, dtype, ranks)
    if cfg.cuda_graph_step:
        step.use_graph(GraphedStep(step.graph_body, optimizer,
                                   capture=None if test_capture is None else test_capture(step)))
    layer_ids = list(dcfg.target_layer_ids)

    def train_step(batch: MicroBatch, index: int, mark=_noop):
        return step([batch], lambda mb, ids, attention: target.features(ids, attention, layer_ids), index + 1, mark)

    vocab = target.facts.vocab_size
    batches = [synthetic_batch(cfg, vocab, i, rank) for i in range(total_steps)]

    # warm-up: synchronized, one by one
    warmup_times = []
    for i in range(cfg.warmup):
        synchronize(device)
        start = time.perf_counter()
        train_step(batches[i], i)
        synchronize(device)
        warmup_times.append(time.perf_counter() - start)
        log(f"warm-up step {i + 1}: {warmup_times[-1]:.2f}s")

    # timed loop: no syncs inside
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    graphs_before = _dynamo_graphs()
    kept_blocks = 0
    losses = []
    synchronize(device)
    if world > 1:  # every rank starts its timed loop together
        dist.barrier()
    start = time.perf_counter()
    for i in range(cfg.warmup, cfg.warmup + cfg.steps):
        result = train_step(batches[i], i)
        losses.append(result.loss)
        kept_blocks += result.kept_blocks
    synchronize(device)
    timed_s = _across_ranks(time.perf_counter() - start, device, world)  # the slowest rank's loop
    kept_blocks = int(_across_ranks(kept_blocks, device, world, op="sum"))
    step_s = timed_s / cfg.steps
    first_step_s = warmup_times[0] if warmup_times else None
    if not warmup_times:  # the first timed step carried the compile; say so
        log("no warm-up: the timed steps include compilation")

    # profiled pass: synchronize at phase boundaries
    phase_totals = dict.fromkeys(PHASES, 0.0)
    profiled_step_s = None
    if cfg.profile_steps and step.graph is not None:  # one launch: no phase boundaries to time
        phase_totals = None
    elif cfg.profile_steps:
        clock = {"t": 0.0}

        def mark(phase: str) -> None:
            synchronize(device)
            now = time.perf_counter()
            phase_totals[phase] += now - clock["t"]
            clock["t"] = now

        begin = cfg.warmup + cfg.steps
        for i in range(begin, begin + cfg.profile_steps):
            synchronize(device)
            clock["t"] = time.perf_counter()
            train_step(batches[i], i, mark)
        phase_totals = {k: v / cfg.profile_steps for k, v in phase_totals.items()}
        profiled_step_s = sum(phase_totals.values())
    recompiles = _dynamo_graphs() - graphs_before
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None

    # throughput and FLOPs
    tokens_per_step = cfg.batch_size * cfg.seq_len * world
    mean_anchor = (cfg.prompt_len + cfg.seq_len - 2) / 2  # anchors uniform over [prompt_len, S - 2]
    flops = step_flops(Shape.of(target.facts), max(dcfg.target_layer_ids) + 1, Shape.of(dcfg),
                       dcfg.num_hidden_layers, len(dcfg.target_layer_ids), cfg.seq_len, cfg.num_anchors,
                       cfg.block_size, mean_anchor)
    flops_per_step = flops.total * cfg.batch_size  # per GPU
    achieved = flops_per_step / step_s / 1e12
    last_loss = float(losses[-1]) if losses else math.nan
    return {
        "config": {**asdict(cfg), "target_layer_ids": list(dcfg.target_layer_ids),
                   "mask_token_id": dcfg.mask_token_id, "drafter_params": sum(p.numel() for p in drafter.parameters())},
        "rank": rank,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
        "steps": cfg.steps,
        "warmup": cfg.warmup,
        "step_time_s": step_s,
        "context_tokens_per_step": tokens_per_step,
        "context_tokens_per_s": tokens_per_step / step_s,
        "world_size": world,
        "context_tokens_per_s_per_gpu": tokens_per_step / step_s / world,
        "drafted_positions_per_step": kept_blocks * cfg.block_size / cfg.steps,
        "drafted_positions_per_s": kept_blocks * cfg.block_size / timed_s,
        "flops_per_context_token": flops.per_token,
        "gflops_per_context_token_breakdown": {k: v / 1e9 for k, v in flops.per_token_breakdown().items()},
        "achieved_tflops": achieved,
        "matmul_ceiling_tflops": ceiling,
        "matmul_ceiling": f"{ceiling_size}^3 {str(ceiling_dtype).removeprefix('torch.')} matmul, measured",
        "mfu": achieved / ceiling,
        "phase_seconds": phase_totals,
        "profiled_step_s": profiled_step_s,
        "phase_timing": ("none: the step is one CUDA graph (--cuda-graph-step)" if step.graph is not None else
                         f"separate profiled pass of {cfg.profile_steps} step(s) after the timed loop, "
                         "synchronize at each phase boundary; the timed loop has no syncs"),
        "cuda_graph_step": None if step.graph is None else {
            "captured": step.graph.graph is not None, "replays": step.graph.replays,
            "eager_steps": step.graph.eager_steps},
        "peak_memory_gib": peak_gib,
        "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "build_s": build_s,
        "first_step_s": first_step_s,
        "compile_cache": cache,
        "compile_s": compilation.compile_seconds()["total"] if cfg.compile else 0.0,
        "compile_breakdown_s": compilation.compile_seconds() if cfg.compile else {},
        "warmup_step_s": warmup_times,
        "recompiles_after_warmup": recompiles,
        "dynamo_graphs_total": _dynamo_graphs(),
        "last_loss": last_loss,
    }
