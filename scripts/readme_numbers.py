"""The README's figures, regenerated from the committed result files (issue 49: numbers you can trust).

    python scripts/readme_numbers.py            # rewrite the marked blocks, docs/figures/*.png and figures.json
    python scripts/readme_numbers.py --check    # exit 1 naming each block (or figures.json) out of step

Every number in the README's Results, Performance and "How to size a run" tables, and in its "Which to
pick" paragraph, is read here from a file under ``docs/results/`` by path and key, and the tables are
written whole between HTML comments that do not render::

    <!-- numbers:results -->
    ...generated...
    <!-- /numbers:results -->

The same goes for the recount table of ``docs/results/README.md`` (every committed evaluation's tau as
it was counted and as it is counted now). ``tests/test_readme_numbers.py`` regenerates every block in
memory and fails when the committed text differs, so a README number cannot drift from its file.

How each kind of number is read:

- **tau** from an evaluation report's per-prompt results (``prompts``) with ``dflash_train.eval.accounting``:
  kept tokens over verify steps pooled over the prompts (``pooled_tau``; the README's tau), the mean of the
  prompts' own taus beside it (``per_prompt_tau``), and the old count, acceptance as verified
  (``verified_tau``), in the recount table; on held-out prompts 1-24 unless a row says otherwise;
- **speedup over a prompt range** from the per-prompt ``spec_decode_tokens_per_s`` and
  ``target_decode_tokens_per_s``: plain decoding time over speculative decoding time, summed over the
  prompts (what ``eval`` reports for all of its prompts; checked against the report's ``speedup``);
- **bench rows** from ``dflash-train bench`` JSONs: ``context_tokens_per_s``, ``mfu``, ``mfu_vs_fp8_ceiling``,
  ``peak_memory_gib``, ``first_step_s``, ``compile_s``, ``compile_cache``, ``phase_seconds``, ``step_time_s``;
- **training throughput** from a run's ``metrics.jsonl``: the median ``tokens_per_s`` of the logged windows
  after the first (which holds the compiling first step), split at the end of the first epoch
  (``N steps/epoch`` in the run's ``train.log``) where a feature cache serves the later epochs;
- **minutes and steps of training** from the run's ``cmd.txt`` or ``train.log`` (``time_budget_minutes``)
  and ``summary.json`` (``steps``).

Dates and labels are text written here; a number never is.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # a checkout without the package installed

from dflash_train.eval.accounting import per_prompt_tau, pooled_tau, verified_tau  # noqa: E402
from dflash_train.eval.compare import compare, parse_range  # noqa: E402
from dflash_train.eval.scaling import fit_log_linear  # noqa: E402

RESULTS = REPO / "docs" / "results"
README = REPO / "README.md"
RESULTS_README = RESULTS / "README.md"
FIGURES = REPO / "docs" / "figures"
FIGURES_JSON = FIGURES / "figures.json"
PNG = {"tau_vs_minutes": "tau_vs_minutes.png", "acceptance_per_position": "acceptance_per_position.png",
       "throughput_vs_gpus": "throughput_vs_gpus.png"}
REPORTED = "1-24"  # the held-out prompts results are reported on

# -- the runs the README names ------------------------------------------------------------------------------

ELEVENTH = "smollm2-h200-12/main"  # DFlash, the recipe (Muon)
TWELFTH = "smollm2-h200-13/main"  # DFlash, the twelfth run's command line (32 rows a step)
DFLASH2 = "dflash2-h200/main"  # DFlash2 + D-PACE, the twelfth run's command line + three overrides
KINDS = "dflash2-h200/kinds"  # the 1.1-minute arms of recipes/smollm2/kinds.sh
FP8B = "fp8-h200/2026-12-04b"  # the reference bench after the second session's three changes
FP8A = "fp8-h200/2026-12-04"  # the compiled target, the MoE shape
FP8 = "fp8-h200"  # 2026-12-03: FP8 without a compiled target
MULTI = "multi-gpu-h200"  # 2026-11-30, two H200s of one machine
SECOND = "2026-12-04, second session"  # the code FP8B measured (docs/results/README.md, its dated section)

# The headline runs of the Results table: (label, date, run folder, fp32 report, bf16 report).
HEADLINE = [
    ("DFlash2 + D-PACE", "2026-12-03", DFLASH2, "eval40-float32", "eval40-bfloat16"),
    ("twelfth: DFlash, 32 rows a step", "2026-12-02", TWELFTH, "eval40", "eval24-bf16"),
    ("eleventh: DFlash, the recipe", "2026-12-02", ELEVENTH, "eval40", "eval24-bf16"),
]


# -- reading ------------------------------------------------------------------------------------------------

@cache
def load(rel: str) -> dict:
    """A JSON file under docs/results (a folder: its eval.json)."""
    path = RESULTS / rel
    if path.is_dir():
        path = path / "eval.json"
    return json.loads(path.read_text(encoding="utf-8"))


def report_path(rel: str) -> str:
    """The file a report's folder or path names, relative to docs/results."""
    return rel + "/eval.json" if (RESULTS / rel).is_dir() else rel


def prompts(rel: str, span: str = REPORTED) -> list[dict]:
    first, last = parse_range(span)
    runs = load(rel)["prompts"]
    if len(runs) < last:
        raise ValueError(f"{rel}: {len(runs)} prompts, not {span}")
    return runs[first:last]


def tau(rel: str, span: str = REPORTED) -> float:
    return pooled_tau(prompts(rel, span))


def tau_pp(rel: str, span: str = REPORTED) -> float:
    return per_prompt_tau(prompts(rel, span))


def speedup(rel: str, span: str = REPORTED) -> float:
    """Plain over speculative decoding time on these prompts, from the per-prompt rates."""
    def seconds(key: str, runs: list[dict]) -> float:
        return sum(max(0, p["new_tokens"] - 1) / p[key] for p in runs)

    every = load(rel)["prompts"]
    whole = seconds("target_decode_tokens_per_s", every) / seconds("spec_decode_tokens_per_s", every)
    if abs(whole - load(rel)["speedup"]) > 1e-3:  # the per-prompt rates must give the report's own figure
        raise ValueError(f"{rel}: per-prompt times give speedup {whole:.4f}, the report {load(rel)['speedup']:.4f}")
    runs = prompts(rel, span)
    return seconds("target_decode_tokens_per_s", runs) / seconds("spec_decode_tokens_per_s", runs)


def lossless(rel: str, span: str = REPORTED) -> tuple[int, int, float]:
    """(prompts that left plain greedy decoding at a near tie, prompts, the tie tolerance in logits)."""
    first, last = parse_range(span)
    check = load(rel)["lossless"]
    if not (check["checked"] and check["ok"]):
        raise ValueError(f"{rel}: the lossless check did not pass")
    verdicts = check["per_prompt"][first:last]
    return sum(v["diverged_at"] is not None for v in verdicts), len(verdicts), check["tolerance"]


def text(rel: str) -> str:
    return (RESULTS / rel).read_text(encoding="utf-8")


def found(pattern: str, rel: str) -> str:
    m = re.search(pattern, text(rel))
    if not m:
        raise ValueError(f"{rel}: no match for {pattern!r}")
    return m.group(1)


def budget_minutes(run: str) -> float:
    """The training budget of a run folder: its cmd.txt, else what its train.log says was spent."""
    if (RESULTS / run / "cmd.txt").exists():
        return float(found(r"train\.time_budget_minutes=([\d.]+)", f"{run}/cmd.txt"))
    return float(found(r"time budget of ([\d.]+) min spent", f"{run}/train.log"))


def steps(run: str) -> int:
    return load(f"{run}/summary.json")["steps"]


def windows(run: str) -> list[tuple[int, int, dict]]:
    """The logged windows of a run's metrics.jsonl as (first step after the previous window, last step, record)."""
    rows = [json.loads(line) for line in text(f"{run}/metrics.jsonl").splitlines() if line.strip()]
    rows = [r for r in rows if "tokens_per_s" in r]
    return [(prev["step"] if prev else 0, r["step"], r) for prev, r in zip([None, *rows], rows)]


def median_window(run: str, key: str = "tokens_per_s", part: str = "all") -> float:
    """The median of ``key`` over the windows after the first; ``part``: ``first-epoch`` (the target runs)
    or ``cache`` (later epochs, from the feature cache), split at the train.log's steps per epoch."""
    spans = windows(run)
    after_first = [(prev, step, r) for prev, step, r in spans if prev >= spans[0][1]]
    if part != "all":
        epoch = int(found(r"(\d+) steps/epoch", f"{run}/train.log"))
        if part == "first-epoch":
            after_first = [w for w in after_first if w[1] <= epoch]
        else:
            after_first = [w for w in after_first if w[0] >= epoch]
    return statistics.median(r[key] for _, _, r in after_first)


def bench(rel: str) -> dict:
    return load(rel)


# -- formatting ---------------------------------------------------------------------------------------------

def f3(x: float) -> str:
    return f"{x:.3f}"


def n0(x: float) -> str:
    return f"{x:,.0f}"


def kilo(x: float) -> str:
    return f"{x / 1000:.1f}K"


def times(x: float) -> str:
    return f"{x:.2f}x"


def paired(base: str, variant: str, span: str) -> str:
    """The variant's mean per-prompt tau difference from the base, its standard error, and where it won."""
    row = compare(load(base), load(variant), variant, parse_range(span))
    return f"{row.mean_diff:+.3f} +- {row.stderr:.3f} (higher on {row.wins}/{row.n})"


def link(rel: str, label: str | None = None, base: str = "docs/results/") -> str:
    """A link to a committed file (``rel`` under docs/results), as the README (``base``) reaches it."""
    path = RESULTS / rel
    if not path.exists():
        raise ValueError(f"docs/results/{rel} does not exist")
    return f"[{label or rel}]({base}{rel})"


def linear(rel: str) -> str:
    return {"splitk": "split-K", "default": "default linear"}[load(rel)["static_linear"]]


# -- README: Results ----------------------------------------------------------------------------------------

def results_block() -> str:
    head = ("| run | trained | held-out tau, fp32 (per-prompt mean) | speedup fp32 | speedup bf16 | "
            "bf16: prompts off plain greedy at a near tie | files |\n|---|---|---|---|---|---|---|")
    rows, fp32_equal = [], []
    for label, date, run, fp32, bf16 in HEADLINE:
        f32, b16 = f"{run}/{fp32}", f"{run}/{bf16}"
        diverged, n, tolerance = lossless(b16)
        fp32_diverged, fp32_n, fp32_tol = lossless(f32)
        fp32_equal.append(fp32_diverged == 0 and fp32_tol == 0)
        rows.append(
            f"| {label} ({date}) | {budget_minutes(run):.1f} min, {n0(steps(run))} steps | **{f3(tau(f32))}** "
            f"({f3(tau_pp(f32))}) | {times(speedup(f32))} | {times(speedup(b16))} ({linear(b16)}) | "
            f"{diverged} of {n} (within {tolerance:g} logits) | {link(report_path(f32), fp32)}, "
            f"{link(report_path(b16), bf16)}, {link(run + '/summary.json', 'summary')} |")
    if not all(fp32_equal):
        raise ValueError("a float32 headline evaluation left plain greedy decoding: the text below says it did not")
    a, b = f"{TWELFTH}/eval24", f"{TWELFTH}/eval24-splitk"
    same = tau(a) == tau(b)
    note = (f"\n\nTau counts kept tokens per verify step, pooled over prompts 1-24 (the mean of the prompts' own "
            f"taus in brackets). Float32: every prompt equal to plain greedy decoding token for token (tolerance "
            f"0). Speedups are over prompts 1-24, of the 40-prompt evaluation where the files name one; the same "
            f"drafter's speedup moves "
            f"between identical runs (the twelfth in two 24-prompt evaluations: {times(speedup(a))} and "
            f"{times(speedup(b))}, tau {'equal' if same else 'different'}: {link(report_path(a), 'eval24')}, "
            f"{link(report_path(b), 'eval24-splitk')}).")
    caption, images = figures_block()
    return "\n".join([head, *rows]) + note + " " + caption + "\n\n" + images


def tau_series() -> list[dict]:
    """Figure (a): held-out tau against training minutes, the recipe's DFlash line and DFlash2 + D-PACE's."""
    curve = load("smollm2-h200-12/tau_vs_compute.json")
    recipe = next(s for s in curve["series"]
                  if any(p["eval"].endswith(f"{ELEVENTH}/eval24/eval.json") for p in s["points"]))
    dflash = [(p["gpu_minutes"], p["eval"].removeprefix("docs/results/")) for p in recipe["points"]]
    dflash2 = [(budget_minutes(f"{KINDS}/dflash2-dpace"), report_path(f"{KINDS}/dflash2-dpace")),
               (budget_minutes(DFLASH2), report_path(f"{DFLASH2}/eval40-float32"))]
    out = []
    for label, points, source in (
            ("DFlash, the recipe (Muon; 16 rows a step)", dflash, "smollm2-h200-12/tau_vs_compute.json"),
            ("DFlash2 + D-PACE (1.1 min: 16 rows a step; 8.0 min: 32)", dflash2, f"{DFLASH2}/cmd.txt, "
             f"{KINDS}/dflash2-dpace/train.log")):
        minutes = [m for m, _ in points]
        taus = [tau(rel) for _, rel in points]
        fit = fit_log_linear(minutes, taus)
        out.append({
            "label": label, "minutes_from": source,
            "points": [{"minutes": m, "tau": round(t, 4), "per_prompt_tau": round(tau_pp(rel), 4),
                        "file": f"docs/results/{rel}"} for (m, rel), t in zip(points, taus)],
            "fit": {"intercept": round(fit.intercept, 4), "slope": round(fit.slope, 4), "r2": round(fit.r2, 4)},
        })
    return out


def figures_block() -> tuple[str, str]:
    """The pictures of the Results section and the sentence that says what they show (with the fits)."""
    series = tau_series()
    fits = "; ".join(f"{s['label'].split(' (')[0]}: tau = {s['fit']['intercept']:.3f} + {s['fit']['slope']:.3f} "
                     f"log10(minutes)" + (f", R^2 {s['fit']['r2']:.2f}" if len(s["points"]) > 2 else " (two points)")
                     for s in series)
    caption = (f"The pictures: held-out tau (prompts 1-24) against minutes of training, fitted: {fits}; acceptance "
               f"per block position as verified (all 40 prompts) of the twelfth run's DFlash and DFlash2 + D-PACE "
               f"(their data: `docs/figures/figures.json`).")
    images = (f"![held-out tau against minutes of training on one H200, DFlash and DFlash2 + D-PACE, with their "
              f"log-linear fits](docs/figures/{PNG['tau_vs_minutes']}) "
              f"![per block position, the share of drafted tokens accepted where verification reached them, DFlash "
              f"(twelfth run) and DFlash2 + D-PACE](docs/figures/{PNG['acceptance_per_position']})")
    return caption, images


# -- README: Drafter kinds, "Which to pick" -----------------------------------------------------------------

def kinds_block() -> str:
    d1, d2 = f"{TWELFTH}/eval40", f"{DFLASH2}/eval40-float32"
    b1, b2 = f"{TWELFTH}/eval24-bf16", f"{DFLASH2}/eval40-bfloat16"
    arm = {name: f"{KINDS}/{name}" for name in ("dflash", "dflash-dpace", "dflash2", "dflash2-dpace")}
    return (
        f"**Which to pick.** SmolLM2-135M-Instruct, one H200, 8 minutes of training each, greedy, held-out prompts "
        f"1-24 ([Results](#results)): DFlash2 + D-PACE (selector loss `exclude`, the default then) reaches tau "
        f"{f3(tau(d2))} against DFlash's {f3(tau(d1))} (the twelfth run, the same command line), "
        f"{paired(d1, d2, REPORTED)} per prompt, but its draft step is dearer ({load(d2)['ms_per_draft_step']:.2f} against "
        f"{load(d1)['ms_per_draft_step']:.2f} ms) and it trains {steps(DFLASH2) / steps(TWELFTH):.2f}x the steps in "
        f"the same time ({n0(steps(DFLASH2))} against {n0(steps(TWELFTH))}): speedup {times(speedup(d2))} against "
        f"{times(speedup(d1))} in float32, {times(speedup(b2))} ({linear(b2)}) against {times(speedup(b1))} "
        f"({linear(b1)}) in bfloat16. So **DFlash stays the default** (on a larger target, where drafting is a "
        f"smaller share of a cycle, measure both). **Pick DFlash2 when your engine serves `DFlash2DraftModel`**, "
        f"with `objective.weighting=dpace` (chosen on held-out prompts 1-40, 1-24 among them; not yet re-made on "
        f"`selection`): at 1.1 minutes D-PACE against the CE gave DFlash2 {paired(arm['dflash2'], arm['dflash2-dpace'], '1-40')} "
        f"tau per prompt and DFlash {paired(arm['dflash'], arm['dflash-dpace'], '1-40')}; with the CE, DFlash2 "
        f"lost to DFlash at equal time: {paired(arm['dflash'], arm['dflash2'], '1-40')}.")


# -- README: How to size a run ------------------------------------------------------------------------------

def size_block() -> str:
    abl = "smollm2-h200-4/runs"
    eq = "smollm2-h200/equal-budget"
    sizes = [(name, int(found(r"data: (\d+) sequences", f"{eq}/{name}/log.txt"))) for name in ("quarter", "half",
                                                                                                "random")]
    recipe = tau_series()[0]
    fit = recipe["fit"]
    best = int(found(r"kept (\d+), skipped", f"{ELEVENTH}/train.log"))
    ref = bench(f"{FP8B}/ref-bf16.json")
    curve_points = ", ".join(f"{p['minutes']:.1f} min: {f3(p['tau'])}" for p in recipe["points"])
    rows = [
        ("drafter layers, block size", f"4 layers, B = 16 in every run (other block sizes: **not measured**); 8 "
         f"layers at equal steps ({steps(abl + '/depth8')}): tau "
         f"{f3(tau(abl + '/depth8'))} against {f3(tau(abl + '/base'))} (no gain, a dearer step)",
         [link(report_path(abl + "/depth8"), "depth8"), link(report_path(abl + "/base"), "base")]),
        ("data size", f"{', '.join(n0(n) for _, n in sizes)} answers at "
         f"{min(steps(f'{eq}/{a}') for a, _ in sizes)}-{max(steps(f'{eq}/{a}') for a, _ in sizes)} steps: tau "
         f"{', '.join(f3(tau(report_path(f'{eq}/{a}/eval-heldout24.json'))) for a, _ in sizes)} (a small gain); "
         f"{n0(best)} answers (three sets) in the recipe's runs",
         [link(f"{eq}/{a}/eval-heldout24.json", a) for a, _ in sizes] + [link(f"{ELEVENTH}/train.log", "train.log")]),
        ("training time", f"the recipe (Muon): {curve_points} ({n0(steps(ELEVENTH))} steps); fit tau = "
         f"{fit['intercept']:.3f} + {fit['slope']:.3f} log10 minutes",
         [link("smollm2-h200-12/tau_vs_compute.json", "tau_vs_compute.json")]
         + [link(p["file"].removeprefix("docs/results/"), p["file"].split("/")[-2]) for p in recipe["points"]]),
        ("what pays", f"optimizer steps: {steps(abl + '/m2')} steps instead of {steps(abl + '/base')}: tau "
         f"{f3(tau(abl + '/m2'))} against {f3(tau(abl + '/base'))}; the best other change of that run, trimmed "
         f"loops: {f3(tau(abl + '/trim-loops'))}",
         [link(report_path(f"{abl}/{a}"), a) for a in ("m2", "base", "trim-loops")]),
        ("a Qwen3-8B-class target (5 layers, B = 16, the `qwen3-8b` recipe)",
         f"training speed only ({n0(ref['context_tokens_per_s'])} context tokens/s on one H200, "
         f"[Performance](#performance)); tau: **not measured**", [link(f"{FP8B}/ref-bf16.json", "ref-bf16.json")]),
    ]
    lines = ["| question | measured | files |", "|---|---|---|"]
    lines += [f"| {q} | {m} | {', '.join(files)} |" for q, m, files in rows]
    return "\n".join(lines)


# -- README: Performance ------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f}"


def performance_block() -> str:
    bf16, bf16_ct = bench(f"{FP8B}/ref-bf16.json"), bench(f"{FP8B}/ref-bf16-ct.json")
    fp8_ct, fp8_ct_b = bench(f"{FP8B}/ref-fp8-ct.json"), bench(f"{FP8B}/ref-fp8-ct-b.json")
    graph = bench(f"{FP8B}/ref-fp8-ct-graph.json")
    cold1, cold2 = bench(f"{FP8}/ref-bf16.json"), bench(f"{FP8A}/ref-bf16.json")
    moe, moe_ct = bench(f"{FP8A}/ref-moe.json"), bench(f"{FP8A}/ref-moe-ct.json")
    old_bf16, old_fp8, old_dfp8 = (bench(f"{FP8}/{n}.json") for n in ("ref-bf16", "ref-target-fp8", "ref-drafter-fp8"))
    one, two = bench(f"{MULTI}/ref-1gpu.json"), bench(f"{MULTI}/ref-2gpu.json")
    if not (cold1["compile_cache"] == cold2["compile_cache"] == "empty" and bf16["compile_cache"] == "warm"):
        raise ValueError("the first-step row's caches are not empty / empty / warm")
    shape = {k: f"{MULTI}/smollm2-shape-{k}" for k in ("one", "coloc", "disagg")}
    tok = {k: median_window(v) for k, v in shape.items()}
    q8 = f"{MULTI}/qwen3-8b-shape-disagg"

    def tps(d: dict) -> str:
        return n0(d["context_tokens_per_s"])

    def files(*rels: str) -> str:  # each named by its folder and file
        return ", ".join(link(r, "/".join(r.split("/")[-2:])) for r in rels)

    rows = [
        ("training step, Qwen3-8B-shaped target, 5-layer B = 16 drafter", SECOND,
         f"{tps(bf16)} context tokens/s, MFU {bf16['mfu']:.3f}, {bf16['peak_memory_gib']:.1f} GiB",
         "`dflash-train bench REF --batch-size 1 --steps 16 --warmup 2 --device cuda`", files(f"{FP8B}/ref-bf16.json")),
        ("the same, target compiled (`target.compile=true`); and its linears in FP8 (`target.fp8_linear=true`)",
         SECOND, f"{tps(bf16_ct)} tokens/s (MFU {bf16_ct['mfu']:.3f}); FP8: **{tps(fp8_ct)}** and "
         f"{tps(fp8_ct_b)} (two calls, a fresh machine each) at **{fp8_ct['peak_memory_gib']:.1f} GiB** (MFU "
         f"{fp8_ct['mfu']:.3f} of the bf16 matmul ceiling, {fp8_ct['mfu_vs_fp8_ceiling']:.3f} of FP8's); without the "
         f"compiled target FP8 was slower than bf16, and so was the FP8 drafter (`train.fp8_drafter`): "
         f"{tps(old_fp8)} and {tps(old_dfp8)} against {tps(old_bf16)} (2026-12-03). The step as one CUDA graph "
         f"(`train.cuda_graph_step`, on by default in one process): {tps(graph)} against {tps(fp8_ct_b)} without "
         "it (FP8, compiled target; same code, same call), slower on this target and not yet explained: with a large "
         "target, compare `train.cuda_graph_step=false`",
         "the same with `target.compile=true`; `target.fp8_linear=true target.compile=true` "
         "(`target.fp8_linear=true`; `train.fp8_drafter=true`; `train.cuda_graph_step=true`)",
         files(f"{FP8B}/ref-bf16-ct.json", f"{FP8B}/ref-fp8-ct.json", f"{FP8B}/ref-fp8-ct-b.json",
               f"{FP8B}/ref-fp8-ct-graph.json", f"{FP8}/ref-target-fp8.json", f"{FP8}/ref-drafter-fp8.json",
               f"{FP8}/ref-bf16.json")),
        ("first step (compiling), empty / warm cache", "2026-12-03; 2026-12-04, both sessions",
         f"{cold1['first_step_s']:.1f} and {cold2['first_step_s']:.1f} s ({cold1['compile_s']:.1f} and "
         f"{cold2['compile_s']:.1f} s compiling) on two fresh machines, the host's speed the difference / "
         f"{bf16['first_step_s']:.2f} s ({bf16['compile_s']:.2f} s compiling)",
         "the REF bench with `TORCHINDUCTOR_CACHE_DIR` a new folder, then again",
         files(f"{FP8}/ref-bf16.json", f"{FP8A}/ref-bf16.json", f"{FP8B}/ref-bf16.json")),
        ("mixture of experts: Qwen3-30B-A3B-shaped target", "2026-12-04, first session", f"{tps(moe)} tokens/s, {moe['peak_memory_gib']:.1f} GiB (target forward "
         f"{ms(moe['phase_seconds']['target_forward'])} of {ms(moe['step_time_s'])} ms); compiled: **{tps(moe_ct)}** "
         f"({ms(moe_ct['phase_seconds']['target_forward'])} ms)",
         "the REF bench with `target.path=qwen3-30b-a3b` [`target.compile=true`]",
         files(f"{FP8A}/ref-moe.json", f"{FP8A}/ref-moe-ct.json")),
        ("2 GPUs, Qwen3-8B-shaped target (one machine)", "2026-11-30",
         f"colocated (REF): {tps(two)} tokens/s against {tps(one)} on one of its GPUs, scaling "
         f"{two['context_tokens_per_s'] / (2 * one['context_tokens_per_s']):.3f}; 1 target + 1 drafter GPU (the "
         f"qwen3-8b recipe, 128 anchors per 3,072-token row): {n0(median_window(q8))} tokens/s (target forward "
         f"{ms(median_window(q8, 'target_forward_s'))} ms, drafter waiting "
         f"{ms(median_window(q8, 'drafter_recv_wait_s'))} ms a step: the target is the bottleneck)",
         "`torchrun --nproc-per-node 2 --no-python dflash-train bench REF --steps 8 --warmup 2 --device cuda`; "
         "`torchrun --nproc-per-node 2 --no-python dflash-train train qwen3-8b $Q --target-ranks 1 --drafter-ranks 1`",
         files(f"{MULTI}/ref-1gpu.json", f"{MULTI}/ref-2gpu.json", f"{q8}/metrics.jsonl")),
        ("2 GPUs, SmolLM2-shaped target (random weights; the recipe of then: 64 rows a step, no feature cache, "
         "eager step)", "2026-11-30",
         f"1 GPU {kilo(tok['one'])}; colocated {kilo(tok['coloc'])} (scaling {tok['coloc'] / (2 * tok['one']):.3f}); "
         f"1 target + 1 drafter GPU {kilo(tok['disagg'])} (drafter compute "
         f"{ms(median_window(shape['disagg'], 'drafter_compute_s'))} ms against target forward "
         f"{ms(median_window(shape['disagg'], 'target_forward_s'))} ms a step: the drafter is the bottleneck)",
         "`torchrun --nproc-per-node 2 --no-python dflash-train train smollm2-1gpu $C` (1 + 1: `--target-ranks 1 "
         "--drafter-ranks 1`; `$C`: [docs/results](docs/results/README.md#several-gpus-on-2026-11-30-readme))",
         files(*(f"{v}/metrics.jsonl" for v in shape.values()))),
        ("SmolLM2 recipe (eleventh run), one H200", "2026-12-02",
         f"{kilo(median_window(ELEVENTH, part='first-epoch'))} context tokens/s in the first epoch, "
         f"{kilo(median_window(ELEVENTH, part='cache'))} from the feature cache",
         '`dflash-train train smollm2-1gpu "data.paths=[greedy-0.jsonl,greedy-1.jsonl,greedy-2.jsonl]" '
         "train.feature_cache_gib=124 train.time_budget_minutes=8.0 eval.prompts=null train.log_every=100`",
         files(f"{ELEVENTH}/metrics.jsonl", f"{ELEVENTH}/train.log")),
    ]
    lines = ["| what | code of | measured | command | files |", "|---|---|---|---|---|"]
    lines += [f"| {w} | {d} | {m} | {c} | {f} |" for w, d, m, c, f in rows]
    return ("\n".join(lines) + f"\n\n![context tokens/s against GPUs, with ideal scaling]"
            f"(docs/figures/{PNG['throughput_vs_gpus']})")


# -- the SmolLM2 recipe's README ------------------------------------------------------------------------------

RECIPE_README = REPO / "src" / "dflash_train" / "recipes" / "smollm2" / "README.md"
FROM_RECIPE = "../../../../docs/results/"  # docs/results as the recipe README links to it


def recipe_block() -> str:
    f32, f24, b16 = f"{ELEVENTH}/eval40", f"{ELEVENTH}/eval24", f"{ELEVENTH}/eval24-bf16"
    kept = int(found(r"kept (\d+), skipped", f"{ELEVENTH}/train.log"))
    return (
        f"The recipe (`recipes/smollm2-1gpu.yaml`: 4 layers, B = 16, packed 512-token rows, 16 a step, Muon at lr 2.4e-3, "
        f"the loss on block positions 1-8 weighted by the drafter's reach, the feature cache) trained "
        f"{budget_minutes(ELEVENTH):.1f} minutes on one H200 over the three committed answer sets ({n0(kept)} "
        f"conversations kept) gave held-out tau **{f3(tau(f32))}** (tokens kept per verify step, float32, held-out "
        f"prompts 1-24; {f3(verified_tau(prompts(f32)))} as counted before 2026-12-05) and speculative decoding "
        f"{times(speedup(f32))} faster than plain decoding in float32 (prompts 1-24 of its 40-prompt evaluation; "
        f"{times(speedup(f24))} in its 24-prompt one), {times(speedup(b16))} in bfloat16 with the {linear(b16)} (the "
        f"eleventh run: {link(report_path(f32), 'eval40', FROM_RECIPE)}, {link(report_path(b16), 'eval24-bf16', FROM_RECIPE)}); "
        f"a second drafter of the same compute (32 rows a step), {f3(tau(TWELFTH + '/eval40'))}. Muon, the loss "
        f"positions and reach weighting were chosen on held-out prompts 1-24 (not yet re-made on `selection`), and "
        f"answer sets 1 and 2 held near-copies of held-out prompts #11, #20, #22 and #24 (training now drops them). "
        f"How the recipe got there, run by run: [docs/results/README.md]({FROM_RECIPE}README.md).")


def recipe_kinds_block() -> str:
    arm = {name: f"{KINDS}/{name}" for name in ("dflash", "dflash-dpace", "dflash2", "dflash2-dpace")}
    d1, d2 = f"{TWELFTH}/eval40", f"{DFLASH2}/eval40-float32"
    return (
        f"**DFlash2 and D-PACE against the recipe** at equal GPU time ({budget_minutes(arm['dflash']):.1f} minutes "
        f"of steps per arm, replayed on the 40 held-out prompts, paired per prompt): `bash "
        f"src/dflash_train/recipes/smollm2/kinds.sh` after `STAGES=data` of the script above (~10 minutes on one "
        f"H200). Measured on 2026-12-03, tau per prompt against the recipe on prompts 1-40: DFlash2 + D-PACE "
        f"{paired(arm['dflash'], arm['dflash2-dpace'], '1-40')}; DFlash + D-PACE "
        f"{paired(arm['dflash'], arm['dflash-dpace'], '1-40')}; DFlash2 with the CE "
        f"{paired(arm['dflash'], arm['dflash2'], '1-40')}. At 8 minutes DFlash2 + D-PACE accepts more "
        f"(tau {f3(tau(d2))} against {f3(tau(d1))}, prompts 1-24) but its dearer draft step gives "
        f"{times(speedup(d2))} against {times(speedup(d1))} in fp32, so the recipe stays DFlash "
        f"([docs/results]({FROM_RECIPE}README.md)).")


# -- docs/results/README.md: the recount ---------------------------------------------------------------------

def run_rank(rel: str) -> tuple:
    """Newest run first: dflash2-h200, then smollm2-h200-13 down to smollm2-h200 (the first)."""
    top = rel.split("/")[0]
    if top.startswith("dflash2"):
        order = 100
    else:
        m = re.fullmatch(r"smollm2-h200(?:-(\d+))?", top)
        order = int(m.group(1) or 1) if m else 0
    return (-order, "/main/" not in rel, rel)


def eval_reports() -> list[str]:
    """Every committed JSON under docs/results holding per-prompt results, newest run first."""
    out = []
    for path in RESULTS.rglob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("prompts"), list) and data["prompts"] \
                and all(isinstance(p, dict) and "acceptance_lengths" in p for p in data["prompts"]):
            out.append(path.relative_to(RESULTS).as_posix())
    return sorted(out, key=run_rank)


def recount_rows() -> list[dict]:
    rows = []
    for rel in eval_reports():
        report = load(rel)
        n, source = len(report["prompts"]), str(report.get("prompts_file", ""))
        if source.endswith("heldout_prompts.txt") or source == "heldout":
            spans, what = ([REPORTED, f"25-{n}", f"1-{n}"] if n > 24 else [f"1-{n}"]), "held-out"
        else:
            spans, what = [f"1-{n}"], "selection" if source == "selection" else "training prompts"
        for span in spans:
            runs = prompts(rel, span)
            rows.append({"file": rel, "prompts": f"{span} ({what})" if what != "held-out" else span,
                         "verified": verified_tau(runs), "kept": pooled_tau(runs), "per_prompt": per_prompt_tau(runs)})
    return rows


def recount_block() -> str:
    lines = ["| file | prompts | old count (as verified) | kept, pooled | per-prompt mean |", "|---|---|---|---|---|"]
    lines += [f"| `{r['file']}` | {r['prompts']} | {f3(r['verified'])} | {f3(r['kept'])} | {f3(r['per_prompt'])} |"
              for r in recount_rows()]
    return "\n".join(lines)


# -- the blocks and the pictures ----------------------------------------------------------------------------

BLOCKS = {  # name -> (file, generator)
    "kinds": (README, kinds_block),
    "size": (README, size_block),
    "performance": (README, performance_block),
    "results": (README, results_block),
    "recount": (RESULTS_README, recount_block),
    "recipe": (RECIPE_README, recipe_block),
    "recipe-kinds": (RECIPE_README, recipe_kinds_block),
}


def marker(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- numbers:{name} -->\n)(?:(.*?)\n)?(<!-- /numbers:{name} -->)", re.S)


def current(text_: str, name: str) -> str | None:
    """The text between a block's markers (None: the file has no such block)."""
    m = marker(name).search(text_)
    return (m.group(2) or "") if m else None


def splice(text_: str, name: str, body: str) -> str:
    if not marker(name).search(text_):
        raise ValueError(f"no <!-- numbers:{name} --> ... <!-- /numbers:{name} --> block")
    return marker(name).sub(lambda m: m.group(1) + body + "\n" + m.group(3), text_, count=1)


def generated() -> dict[str, str]:
    return {name: make() for name, (_, make) in BLOCKS.items()}


def figures_data() -> dict:
    """Exactly what each picture draws."""
    acceptance = []
    for label, rel in (("DFlash (twelfth run)", f"{TWELFTH}/eval40"),
                       ("DFlash2 + D-PACE", f"{DFLASH2}/eval40-float32")):
        report = load(rel)
        acceptance.append({"label": label, "file": f"docs/results/{report_path(rel)}",
                           "key": "per_position_acceptance", "values": report["per_position_acceptance"],
                           "reached": report["per_position_reached"]})
    one, two = (bench(f"{MULTI}/ref-{n}gpu.json") for n in (1, 2))
    shape = {k: f"{MULTI}/smollm2-shape-{k}" for k in ("one", "coloc", "disagg")}
    panels = [
        {"title": "Qwen3-8B-shaped target, REF bench", "key": "context_tokens_per_s", "points": [
            {"gpus": 1, "layout": "one GPU", "tokens_per_s": round(one["context_tokens_per_s"], 1),
             "file": f"docs/results/{MULTI}/ref-1gpu.json"},
            {"gpus": 2, "layout": "colocated", "tokens_per_s": round(two["context_tokens_per_s"], 1),
             "file": f"docs/results/{MULTI}/ref-2gpu.json"}]},
        {"title": "SmolLM2-shaped target, training", "key": "median tokens_per_s of the windows after the first",
         "points": [{"gpus": g, "layout": layout, "tokens_per_s": round(median_window(shape[k]), 1),
                     "file": f"docs/results/{shape[k]}/metrics.jsonl"}
                    for g, layout, k in ((1, "one GPU", "one"), (2, "colocated", "coloc"),
                                         (2, "1 target + 1 drafter GPU", "disagg"))]},
    ]
    for panel in panels:
        panel["ideal"] = [{"gpus": g, "tokens_per_s": round(g * panel["points"][0]["tokens_per_s"], 1)} for g in (1, 2)]
    return {
        "tau_vs_minutes": {"prompts": f"held-out {REPORTED}", "tau": "kept tokens per verify step, pooled "
                           "(dflash_train.eval.accounting.pooled_tau)", "series": tau_series()},
        "acceptance_per_position": {"prompts": "held-out 1-40", "series": acceptance},
        "throughput_vs_gpus": {"panels": panels},
    }


def draw(data: dict, folder: Path) -> None:
    """The three PNGs from ``figures_data()`` (Agg, fixed size and dpi, no metadata: the same bytes each time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / PNG[name], format="png", dpi=100, metadata={"Software": None})
        plt.close(fig)

    thousands = FuncFormatter(lambda v, _: f"{v / 1000:,.0f}K")
    folder.mkdir(parents=True, exist_ok=True)

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ticks = sorted({p["minutes"] for s in data["tau_vs_minutes"]["series"] for p in s["points"]})
    for i, s in enumerate(data["tau_vs_minutes"]["series"]):
        xs = [p["minutes"] for p in s["points"]]
        ax.plot(xs, [p["tau"] for p in s["points"]], "os"[i], color=f"C{i}", label=s["label"])
        grid = [min(xs) * (max(xs) / min(xs)) ** (k / 49) for k in range(50)]
        f = s["fit"]
        ax.plot(grid, [f["intercept"] + f["slope"] * math.log10(g) for g in grid], "--", color=f"C{i}",
                label=f"tau = {f['intercept']:.3f} + {f['slope']:.3f} log10(minutes)")
    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("minutes of training, one H200 (log scale)")
    ax.set_ylabel("held-out tau, prompts 1-24 (kept tokens)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, "tau_vs_minutes")

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    counts = ax.twinx()
    series = data["acceptance_per_position"]["series"]
    for i, s in enumerate(series):
        pos = [k + 1 for k, v in enumerate(s["values"]) if v is not None]
        ax.plot(pos, [s["values"][k - 1] for k in pos], "os"[i] + "-", color=f"C{i}", label=s["label"], zorder=3)
        counts.bar([k + (i - 0.5) * 0.38 for k in pos], [s["reached"][k - 1] for k in pos], width=0.38,
                   color=f"C{i}", alpha=0.18)
    ax.set_xlabel("block position (1 = the first drafted token)")
    ax.set_ylabel("accepted where reached (lines)")
    counts.set_ylabel("verify steps that reached it (bars, log scale)")
    counts.set_yscale("log")
    ax.set_ylim(0, 1)
    ax.set_zorder(counts.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    save(fig, "acceptance_per_position")

    panels = data["throughput_vs_gpus"]["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(8.0, 3.6))
    for ax, panel in zip(axes, panels):
        ideal = panel["ideal"]
        ax.plot([p["gpus"] for p in ideal], [p["tokens_per_s"] for p in ideal], "--", color="grey", label="ideal")
        for i, p in enumerate(panel["points"]):
            ax.plot([p["gpus"]], [p["tokens_per_s"]], "os^"[i], color=f"C{i}", label=p["layout"])
        ax.set_xticks([1, 2])
        ax.set_xlim(0.7, 2.3)
        ax.set_ylim(0, 1.1 * max(p["tokens_per_s"] for p in ideal))
        ax.yaxis.set_major_formatter(thousands)
        ax.set_xlabel("GPUs (H200)")
        ax.set_ylabel("context tokens/s")
        ax.set_title(panel["title"], fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    save(fig, "throughput_vs_gpus")


def figures_json(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def shown(path: Path) -> str:
    """A path as a message names it: repository-relative where it can be."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def out_of_step() -> list[str]:
    """The names of the blocks (and figure files) whose committed text differs from what the files give."""
    stale, texts = [], {}
    for name, body in generated().items():
        path = BLOCKS[name][0]
        texts.setdefault(path, path.read_text(encoding="utf-8"))
        if current(texts[path], name) != body:
            stale.append(f"{shown(path)}: numbers:{name}")
    if not FIGURES_JSON.exists() or FIGURES_JSON.read_text(encoding="utf-8") != figures_json(figures_data()):
        stale.append("docs/figures/figures.json")
    stale += [f"docs/figures/{png} (missing)" for png in PNG.values() if not (FIGURES / png).exists()]
    return stale


def write() -> list[str]:
    changed, texts = [], {}
    for name, body in generated().items():
        path = BLOCKS[name][0]
        texts[path] = splice(texts.get(path) or path.read_text(encoding="utf-8"), name, body)
    for path, new in texts.items():
        if path.read_text(encoding="utf-8") != new:
            path.write_text(new, encoding="utf-8")
            changed.append(str(path.relative_to(REPO)))
    data = figures_data()
    FIGURES.mkdir(parents=True, exist_ok=True)
    if not FIGURES_JSON.exists() or FIGURES_JSON.read_text(encoding="utf-8") != figures_json(data):
        FIGURES_JSON.write_text(figures_json(data), encoding="utf-8")
        changed.append(str(FIGURES_JSON.relative_to(REPO)))
    draw(data, FIGURES)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each block out of step")
    args = parser.parse_args(argv)
    if args.check:
        stale = out_of_step()
        for name in stale:
            print(f"out of step: {name} (regenerate: python scripts/readme_numbers.py)")
        return 1 if stale else 0
    for path in write():
        print(f"wrote {path}")
    print(f"drew {', '.join(PNG.values())} in docs/figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
