"""``dflash-train bench`` on the tiny CPU target: one JSON object with every field, sane values; the job
config (a recipe, overrides, the older flags as aliases) decides the step it times."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from dflash_train.cli import main  # noqa: E402

FIELDS = {
    "config", "device_name", "torch_version", "steps", "warmup", "step_time_s", "context_tokens_per_step",
    "context_tokens_per_s", "drafted_positions_per_step", "drafted_positions_per_s", "flops_per_context_token",
    "gflops_per_context_token_breakdown", "achieved_tflops", "matmul_ceiling_tflops", "matmul_ceiling", "mfu",
    "phase_seconds", "profiled_step_s", "phase_timing", "peak_memory_gib", "peak_host_rss_gib", "build_s",
    "first_step_s", "compile_cache", "compile_s", "compile_breakdown_s", "warmup_step_s", "recompiles_after_warmup", "dynamo_graphs_total", "last_loss",
    "rank", "world_size", "context_tokens_per_s_per_gpu", "cuda_graph_step",
    "matmul_ceiling_fp8_tflops", "mfu_vs_fp8_ceiling",
}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["bench", "train.num_anchors=8", "--target-config", "tiny", "--steps", "2", "--warmup", "1",
                   "--device", "cpu", "--out", str(out)])
    assert rc == 0
    printed = json.loads(stdout.getvalue())  # exactly one JSON object on stdout
    assert json.loads(out.read_text()) == printed
    return printed


def test_every_field_present(result):
    assert set(result) == FIELDS


def test_sane_values(result):
    cfg = result["config"]
    assert set(cfg) == {"target", "drafter", "optim", "train", "objective", "bench"}  # the job's step sections
    bench = cfg["bench"]
    assert bench["seq_len"] == 128 and cfg["train"]["num_anchors"] == 8 and cfg["drafter"]["block_size"] == 16
    assert bench["attention"] == "sdpa" and bench["compiled"] is False and bench["device"] == "cpu"
    assert bench["target_config"] == cfg["target"]["path"] == "tiny"
    assert cfg["drafter"]["target_layer_ids"] == [1, 2, 3, 4, 5]  # the spec's rule for an 8-layer target
    assert cfg["train"]["cuda_graph_step"] is False  # no recipe: the eager step older command lines timed
    assert result["steps"] == 2 and result["warmup"] == 1
    step = result["step_time_s"]
    assert step > 0
    assert result["context_tokens_per_step"] == 128
    assert result["context_tokens_per_s"] == pytest.approx(128 / step)
    assert result["drafted_positions_per_step"] == 8 * 16  # every block kept: the loss mask is nearly all ones
    assert result["drafted_positions_per_s"] == pytest.approx(8 * 16 / step)
    breakdown = result["gflops_per_context_token_breakdown"]
    assert sum(breakdown.values()) * 1e9 == pytest.approx(result["flops_per_context_token"])
    assert all(v > 0 for v in breakdown.values())
    assert result["achieved_tflops"] == pytest.approx(result["flops_per_context_token"] * 128 / step / 1e12)
    assert result["matmul_ceiling_tflops"] > 0 and "float32" in result["matmul_ceiling"]
    assert result["mfu"] == pytest.approx(result["achieved_tflops"] / result["matmul_ceiling_tflops"])
    assert 0 < result["mfu"] < 5  # a tiny model is far from the ceiling; no absurd values
    assert result["matmul_ceiling_fp8_tflops"] is None and result["mfu_vs_fp8_ceiling"] is None  # no FP8 run
    phases = result["phase_seconds"]
    assert set(phases) == {"prepare", "target_forward", "drafter_forward", "backward", "optimizer"}
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(result["profiled_step_s"])
    assert result["peak_memory_gib"] is None  # no CUDA here
    assert result["peak_host_rss_gib"] > 0
    assert result["first_step_s"] > 0 and len(result["warmup_step_s"]) == 1
    assert result["recompiles_after_warmup"] == 0
    assert math.isfinite(result["last_loss"]) and result["last_loss"] > 0


def _tiny(*overrides: str, recipe: str | None = None):
    """The job bench times on the tiny shape with 8 anchors (a recipe's, or the defaults), plus ``overrides``."""
    from dflash_train.bench.job import bench_job

    return bench_job(recipe, ["train.num_anchors=8", *overrides], "tiny")


def _opts(**kw):
    from dflash_train.bench.job import BenchOptions

    return BenchOptions(**{"steps": 3, "warmup": 1, "profile_steps": 0, "device": "cpu", **kw})


def test_graphed_step_bench_replays_and_trains_as_the_eager_one():
    """train.cuda_graph_step (a CPU stand-in capture; on CUDA the real one): the warm-up runs eagerly, every
    timed step is a replay, no phase split is claimed, and the losses are the eager bench's. Without the
    stand-in the CPU step runs eagerly, as the trainer's would."""
    from testkit import dry_capture

    from dflash_train.bench.run import run_bench

    def quiet(*_):
        pass

    def capture(step):
        return dry_capture(step.drafter.parameters(), step.optimizer, extra=[step.bad])

    opts = _opts(warmup=2, profile_steps=1)
    eager = run_bench(_tiny(), opts, log=quiet)
    graphed = run_bench(_tiny("train.cuda_graph_step=true"), opts, log=quiet, test_capture=capture)
    assert eager["cuda_graph_step"] is None
    assert graphed["cuda_graph_step"] == {"captured": True, "replays": 3, "eager_steps": 2}
    assert graphed["phase_seconds"] is None and graphed["profiled_step_s"] is None
    assert graphed["last_loss"] == pytest.approx(eager["last_loss"], rel=1e-5)
    assert run_bench(_tiny("train.cuda_graph_step=true"), _opts(steps=1), log=quiet)["cuda_graph_step"] is None


def test_bench_times_the_muon_step():
    """optim.name=muon: the timed step runs Muon (its config is in the JSON) and trains: the loss differs
    from AdamW's after the same steps on the same batches."""
    from dflash_train.bench.run import run_bench

    adamw = run_bench(_tiny(), _opts(), log=lambda *_: None)
    muon = run_bench(_tiny("optim.name=muon"), _opts(), log=lambda *_: None)
    assert muon["config"]["optim"]["name"] == "muon" and adamw["config"]["optim"]["name"] == "adamw"
    assert math.isfinite(muon["last_loss"]) and muon["last_loss"] != pytest.approx(adamw["last_loss"], rel=1e-4)


def test_bench_times_the_dflash2_and_dpace_step():
    """drafter.kind=dflash2 / objective.weighting=dpace: the timed step trains that drafter (its selector's
    codebooks are in the step: DFlash2's parameter count exceeds DFlash's) with that weighting (the loss
    differs from the decay's after the same steps on the same batches); both are in the JSON's config."""
    from dflash_train.bench.run import run_bench

    plain = run_bench(_tiny(), _opts(), log=lambda *_: None)
    dpace = run_bench(_tiny("objective.weighting=dpace"), _opts(), log=lambda *_: None)
    two = run_bench(_tiny("drafter.kind=dflash2"), _opts(), log=lambda *_: None)
    assert (two["config"]["drafter"]["kind"], dpace["config"]["objective"]["weighting"]) == ("dflash2", "dpace")
    assert two["config"]["bench"]["drafter_params"] > plain["config"]["bench"]["drafter_params"]
    assert math.isfinite(dpace["last_loss"]) and dpace["last_loss"] != pytest.approx(plain["last_loss"], rel=1e-4)
    with pytest.raises(ValueError, match="drafter.kind"):
        _tiny("drafter.kind=dflash3")


def test_older_flags_write_their_overrides():
    """The flags bench had before it read a job config write the override each names (docs/results
    quotes them); overrides given as words come after them, so they win."""
    from dflash_train.bench.cli import job_words
    from dflash_train.cli import build_parser

    args = build_parser().parse_args([
        "bench", "qwen3-8b", "train.seed=5", "--drafter-layers", "3", "--block-size", "8", "--target-layer-ids",
        "1,9", "--num-anchors", "64", "--attention", "flex", "--no-compile", "--loss-chunk-size", "512",
        "--checkpoint-drafter", "--cuda-graph-step", "--optim", "muon", "--drafter-kind", "dflash2",
        "--weighting", "reach", "--target-fp8", "--compile-target", "--drafter-fp8", "--dtype", "bfloat16",
        "--seed", "2"])
    recipe, overrides = job_words(args)
    assert recipe == "qwen3-8b" and overrides[-1] == "train.seed=5"
    assert sorted(overrides) == sorted([
        "drafter.num_hidden_layers=3", "drafter.block_size=8", "drafter.target_layer_ids=[1, 9]",
        "train.num_anchors=64", 'train.attention="flex"', "train.compile=false", "objective.chunk_size=512",
        "train.activation_checkpointing=true", "train.cuda_graph_step=true", 'optim.name="muon"',
        'drafter.kind="dflash2"', 'objective.weighting="reach"', "target.fp8_linear=true",
        "target.compile=true", "train.fp8_drafter=true", 'target.dtype="bfloat16"', "train.seed=2", "train.seed=5"])
    recipe, overrides = job_words(build_parser().parse_args(["bench", "train.seed=1", "--steps", "2"]))
    assert recipe is None and overrides == ["train.seed=1"]  # no recipe: the first word is an override


def test_the_older_reference_line_times_the_readmes_reference_job():
    """docs/results quotes the reference bench in the older flags (no recipe); the README's REF is the
    qwen3-8b recipe: the same drafter, anchors, rows, optimizer, objective and eager step."""
    from dflash_train.bench.cli import job_words
    from dflash_train.bench.job import BenchOptions, bench_job
    from dflash_train.cli import build_parser

    older = ("bench --target-config qwen3-8b --drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 "
             "--num-anchors 512 --seq-len 3072 --batch-size 1 --steps 16 --warmup 2 --attention flex --compile")
    readme = "bench qwen3-8b target.path=qwen3-8b train.cuda_graph_step=false --batch-size 1 --steps 16 --warmup 2"
    jobs = []
    for line in (older, readme):
        args = build_parser().parse_args(line.split())
        job = bench_job(*job_words(args), args.target_config)
        jobs.append((job, BenchOptions(seq_len=args.seq_len, device="cpu").resolved(job).seq_len))
    (old, old_seq), (new, new_seq) = jobs
    assert old_seq == new_seq == 3072 and old.target.path == new.target.path == "qwen3-8b"
    for section in ("optim", "objective"):
        assert getattr(old, section) == getattr(new, section), section
    for key in ("num_hidden_layers", "block_size", "target_layer_ids", "kind", "options"):
        assert getattr(old.drafter, key) == getattr(new.drafter, key), key
    for key in ("num_anchors", "compile", "cuda_graph_step", "seed", "grad_accum", "activation_checkpointing"):
        assert getattr(old.train, key) == getattr(new.train, key), key
    assert (old.train.attention, new.train.attention) == ("flex", "auto")  # auto is flex on CUDA


def test_a_recipe_is_the_job_bench_times():
    """A recipe's drafter, optimizer and objective reach the timed job; overrides change them; the row
    length defaults to the recipe's data.max_length (128 on a tiny shape)."""
    from dflash_train.bench.job import BenchOptions, bench_job

    job = _tiny("drafter.target_layer_ids=null", "objective.loss_positions=4", recipe="smollm2-1gpu")
    assert (job.drafter.num_hidden_layers, job.optim.name, job.objective.weighting) == (4, "muon", "reach")
    assert job.objective.loss_positions == 4 and job.train.num_anchors == 8 and job.target.path == "tiny"
    assert job.train.cuda_graph_step is True  # the job's own default: the trainer graphs the step on CUDA
    assert BenchOptions(device="cpu").resolved(job).seq_len == 128
    assert BenchOptions(device="cpu").resolved(bench_job("smollm2-1gpu")).seq_len == 512
    with pytest.raises(ValueError, match="train.num_anchors"):
        bench_job("smollm2-1gpu", ["train.num_anchors=0"])


def test_flex_on_cpu_is_refused(capsys):
    rc = main(["bench", "--target-config", "tiny", "--steps", "1", "--warmup", "0", "--device", "cpu",
               "--attention", "flex"])
    assert rc == 2
    assert "flex" in capsys.readouterr().err


def _cuda_tiny_bench(*flags: str) -> dict:
    """The JSON of ``bench`` on the tiny target on CUDA (3 timed steps after 2 warm-up ones)."""
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["bench", "train.num_anchors=8", "--target-config", "tiny", "--steps", "3", "--warmup", "2",
                   "--device", "cuda", "--matmul-size", "2048", *flags])
    assert rc == 0
    return json.loads(stdout.getvalue())


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_cuda_flex_compiled_tiny(tmp_path):
    """The CUDA path on the tiny target: flex BlockMask, compiled layers, checkpointing, no recompiles."""
    result = _cuda_tiny_bench("--checkpoint-drafter")
    assert result["config"]["bench"]["attention"] == "flex" and result["config"]["bench"]["compiled"] is True
    assert "bfloat16" in result["matmul_ceiling"]
    assert result["peak_memory_gib"] > 0
    assert result["recompiles_after_warmup"] == 0
    assert result["dynamo_graphs_total"] > 0
    assert math.isfinite(result["last_loss"])


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_step_tiny():
    """train.cuda_graph_step (--cuda-graph-step) with the real capture on the tiny target: the timed steps are
    replays."""
    result = _cuda_tiny_bench("--cuda-graph-step")
    assert result["cuda_graph_step"] == {"captured": True, "replays": 3, "eager_steps": 2}
    assert math.isfinite(result["last_loss"])


def test_bench_and_eval_need_no_data_stack():
    """The GPU machine lacks `datasets` unless it is carried: the bench, eval and export paths
    must import without it (it is loaded only where data is read)."""
    import subprocess
    import sys

    code = ("import sys; import dflash_train.cli, dflash_train.bench.run, dflash_train.eval.evaluate, "
            "dflash_train.export.serving, dflash_train.train.trainer; "
            "assert 'datasets' not in sys.modules, 'datasets imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_bench_on_a_moe_target():
    """--target-config tiny-moe: a sparse-expert target (the qwen3-30b-a3b layout, tiny) through the same step;
    the FLOP model counts the active experts (top-k x expert width = the dense width here)."""
    from dflash_train.bench.job import bench_job
    from dflash_train.bench.run import build_target, run_bench

    target = build_target("tiny-moe", torch.device("cpu"), torch.float32)
    assert type(target.model).__name__ == "Qwen3MoeForCausalLM"
    job = bench_job(None, ["train.num_anchors=8"], "tiny-moe")
    result = run_bench(job, _opts(steps=2), log=lambda *_: None)
    assert math.isfinite(result["last_loss"]) and result["config"]["bench"]["target_config"] == "tiny-moe"
