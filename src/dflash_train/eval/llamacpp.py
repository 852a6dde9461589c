"""``dflash-train eval --engine llama.cpp``: what llama.cpp serves, measured and set beside our decoder.

For each prompt (chat template applied by the target's tokenizer, passed to llama.cpp as text),
three decodes in llama.cpp and two of ours, all greedy:

- ``llama-speculative-simple --spec-type draft-dflash -lv 5`` (``draft-dspark`` for a DSpark drafter):
  the engine's speculative decode.
  Per verify step it logs ``accepted A/N draft tokens``; at the end its own statistics
  (``#mean acc len``, acceptance per block position) and ``decoded K tokens in T seconds``;
- ``llama-completion``: the engine's plain greedy decode (its tokens/s; the lossless reference);
- our reference loop (``--engine hf``): plain greedy and speculative, float32.

**One accounting.** The two decoders run the same algorithm but book it differently:

- llama.cpp's **first step** drafts from the last *prompt* token (it keeps that token out of
  the prefill); our prefill emits the first new token instead. That step stands for our prefill
  and is reported apart (it accepted 0 in every run we made: the drafter was trained to draft
  after answer tokens);
- llama.cpp **runs past ``-n``** (it stops once it has *more* than ``-n`` tokens, so its last
  steps may overrun), and shortens the drafts of the steps that reach ``-n``; our decoder drafts
  full blocks and keeps what fits;
- ``#mean acc len`` is llama.cpp's tokens per step over all its steps (first step and overrun
  included). Our **tau** is tokens committed per verify step: the tokens within ``-n`` (the
  first one, the prefill's, excluded) over the steps that produced them (a step cut by the
  budget or a stop token counts what it kept). The report gives tau for both decoders by that
  rule, and llama.cpp's own figures beside it.

**Aligned steps.** Our step ``i`` is llama.cpp's step ``i + 1``. Between the two ends (past the
engine's first step; before our last step, and before any engine step that drafted fewer than
``B - 1`` tokens because ``-n`` was near) the accepted-draft counts must be equal: the engine
drafts what the trainer drafted. A difference there on a drafter that accepts is a bug to find.
A step that a stop token ended is booked by llama.cpp as accepting the drafts before it (it stops
accepting at an end-of-generation draft), ours as verified: the end check compares what ours kept.

**Near-ties.** llama.cpp's one-token decode and its verify batches round differently, so in float32
too its plain and speculative decodes can part where two tokens are nearly tied. Every parting from
our plain greedy decode is reported with the gap in our float32 logits; one within
``NEAR_TIE_LOGITS`` is reported and passes, any other fails, and the steps past a parting of the
speculative decode are not compared (they decode other tokens).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dflash_train.decoding.core import Tally, book_steps, tally
from dflash_train.llamacpp import LLAMA_CPP_VERSION, LlamaCppError

_STEP = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_STATS = re.compile(r"statistics\s+draft-\w+:.*#mean acc len = ([\d.]+), #acc rate/pos = \(([^)]*)\)")
_EVAL = re.compile(r"common_perf_print:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs")
_PROMPT_EVAL = re.compile(r"common_perf_print: prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
_SAMPLED = re.compile(r"common_perf_print:\s+samplers time =\s+[\d.]+ ms /\s+(\d+) tokens")
_PROMPT_TOKENS = re.compile(r"\bD tokens: \[ (.*?) \]\n", re.S)  # token texts print raw (newlines too)
_END_OF_TEXT = " [end of text]\n"


@dataclass
class EngineStep:
    """One llama.cpp verify step: ``accepted`` of ``drafted`` drafts; the step's last token."""

    accepted: int
    drafted: int
    last_token: int


@dataclass
class SpecRun:
    """One ``llama-speculative-simple`` run, read from its output."""

    text: str
    steps: list[EngineStep]
    tokens: int  # its n_predict: every token it committed, overrun included
    seconds: float  # its decode time (after the prompt)
    mean_acc_len: float | None  # its statistics line
    acc_rate_per_pos: list[float] = field(default_factory=list)
    stats_line: str = ""


@dataclass
class PlainRun:
    """One ``llama-completion`` run: the text, tokens generated (a stop token included), decode time."""

    text: str
    tokens: int
    seconds: float
    runs: int
    prompt_ids: list[int] | None
    ended_by_stop: bool


def parse_speculative(stdout: str, stderr: str, prompt: str) -> SpecRun:
    """Read a ``llama-speculative-simple -lv 5`` run. Its stdout is ``"\\n\\n"``, the prompt's
    pieces, the generated pieces (stop token not printed), then two ``"\\n\\n"``."""
    start = stdout.find(prompt)
    if start < 0:
        raise ValueError("llama-speculative-simple: its output does not repeat the prompt; cannot find the "
                         "generated text")
    text = stdout[start + len(prompt):]
    text = text[:-4] if text.endswith("\n\n\n\n") else text.rstrip("\n")
    steps = [EngineStep(int(a), int(n), int(t)) for a, n, t in _STEP.findall(stderr)]
    decoded = _DECODED.search(stderr)
    if decoded is None or not steps:
        raise ValueError("llama-speculative-simple: no 'accepted A/N draft tokens' or 'decoded' lines "
                         "(run with -lv 5; did it fail?)")
    stats = _STATS.search(stderr)
    rates = [float(x) for x in stats.group(2).replace(",", " ").split()] if stats else []
    return SpecRun(text, steps, int(decoded.group(1)), float(decoded.group(2)),
                   float(stats.group(1)) if stats else None, rates, stats.group(0) if stats else "")


def _prompt_ids(stderr: str) -> list[int] | None:
    found = _PROMPT_TOKENS.search(stderr)
    return [int(x) for x in re.findall(r"':(\d+)(?=, '|\s*$)", found.group(1).strip())] if found else None


def parse_completion(stdout: str, stderr: str) -> PlainRun:
    """Read a ``llama-completion --no-display-prompt -lv 5`` run. Its stdout is a newline, the
    generated pieces, ``" [end of text]"`` when a stop token ended it, then ``"\\n\\n"``."""
    text = stdout[1:] if stdout.startswith("\n") else stdout
    text = text[:-2] if text.endswith("\n\n") else text
    stopped = text.endswith(_END_OF_TEXT)
    text = text[: -len(_END_OF_TEXT)] if stopped else text
    evals, sampled, prompt = _EVAL.search(stderr), _SAMPLED.search(stderr), _PROMPT_EVAL.search(stderr)
    if evals is None or sampled is None or prompt is None:
        raise ValueError("llama-completion: no 'eval time' / 'samplers time' lines in its log; did it fail?")
    ids = _prompt_ids(stderr)
    prompt_tokens = len(ids) if ids is not None else int(prompt.group(2))
    return PlainRun(text, int(sampled.group(1)) - prompt_tokens, float(evals.group(1)) / 1e3, int(evals.group(2)),
                    ids, stopped)


# -- running the engine --------------------------------------------------------------------------

@dataclass
class EngineConfig:
    """How llama.cpp runs: its programs, the two GGUFs, the draft length (B - 1), threads, context, and
    the drafter kind's ``--spec-type`` (``export/gguf.py``: draft-dflash, draft-dspark)."""

    binaries: dict[str, Path]
    target_gguf: Path
    drafter_gguf: Path
    n_draft: int
    threads: int = 1
    context: int = 2048
    timeout_s: float = 600.0  # per program run (one request): --request-timeout
    spec_type: str = "draft-dflash"
    log_dir: Path | None = None  # where each program's log is kept (its last run's); None: a temporary folder


def _common(cfg: EngineConfig, prompt: str, n: int) -> list[str]:
    return ["-p", prompt, "-n", str(n), "--temp", "0", "--top-k", "1", "-c", str(cfg.context),
            "-t", str(cfg.threads), "-lv", "5"]


def _run(cmd: list[str], what: str, timeout: float, log_dir: Path | None = None) -> tuple[str, str]:
    """One program run (one request): its stdout and its log (stderr), both kept in ``log_dir``
    (``<program>.stdout`` / ``<program>.log``, the last run's; a temporary folder when None). A failure
    is one line (:func:`dflash_train.engine_process.run_engine_process`): crash, out of memory, no answer
    within ``timeout`` seconds, with the log's last lines; the program's process group never outlives it."""
    import tempfile

    from dflash_train.engine_process import run_engine_process
    from dflash_train.llamacpp import LLAMA_CPP_BUILD
    from dflash_train.llamacpp.build import BUILD_HINT

    with tempfile.TemporaryDirectory(prefix="llama-cpp-") as tmp:
        folder = Path(log_dir) if log_dir is not None else Path(tmp)
        log, out = folder / f"{what}.log", folder / f"{what}.stdout"
        run_engine_process(cmd, engine=f"llama.cpp build {LLAMA_CPP_BUILD}", what=what, log=log, stdout=out,
                           timeout=timeout, hint=BUILD_HINT, error=LlamaCppError)
        return out.read_text(encoding="utf-8", errors="replace"), log.read_text(encoding="utf-8", errors="replace")


def run_speculative(cfg: EngineConfig, prompt: str, n: int) -> SpecRun:
    cmd = [str(cfg.binaries["llama-speculative-simple"]), "-m", str(cfg.target_gguf), "-md", str(cfg.drafter_gguf),
           "--spec-type", cfg.spec_type, "--spec-draft-n-max", str(cfg.n_draft), *_common(cfg, prompt, n)]
    return parse_speculative(*_run(cmd, "llama-speculative-simple", cfg.timeout_s, cfg.log_dir), prompt)


def run_plain(cfg: EngineConfig, prompt: str, n: int) -> PlainRun:
    cmd = [str(cfg.binaries["llama-completion"]), "-m", str(cfg.target_gguf), "-no-cnv", "--no-display-prompt",
           *_common(cfg, prompt, n)]
    return parse_completion(*_run(cmd, "llama-completion", cfg.timeout_s, cfg.log_dir))


# -- one accounting --------------------------------------------------------------------------------

def kept_steps(committed: list[int], kept: int) -> tuple[int, list[int]]:
    """How many of the steps (``committed[i]`` tokens each, in order) produce the first ``kept``
    tokens, and what each of them kept (the last one cut): the ledger's booking
    (:func:`~dflash_train.decoding.core.book_steps`) after a prefill token."""
    booked = book_steps([c - 1 for c in committed], kept + 1)
    return len(booked.kept_lengths), booked.kept_lengths


def engine_tau(steps: list[EngineStep], kept_tokens: int) -> dict:
    """llama.cpp's decode booked by our rule: its first step stands for our prefill; of its other
    steps, those that produce tokens 2..``kept_tokens`` count, each with what it kept."""
    if not steps:
        return {"tau": 0.0, "steps": 0, "kept_tokens": 0}
    first = steps[0].accepted + 1
    booked = book_steps([s.accepted for s in steps[1:]], max(0, kept_tokens - first) + 1)
    counted = tally([booked])
    n, kept = counted.num_steps, sum(counted.kept)
    # the first step's drafts past its first token (it accepted some) count as committed, the step does not
    counted.kept[0] += min(first, kept_tokens) - 1
    return {"tau": counted.tau(), "steps": n, "kept_tokens": min(kept_tokens, first + kept),
            "first_step": {"accepted": steps[0].accepted, "drafted": steps[0].drafted},
            "overrun_tokens": sum(s.accepted + 1 for s in steps) - kept_tokens,
            "overrun_steps": len(steps) - 1 - n}


def align(engine: list[EngineStep], ours: list[int], n_draft: int, stop_kept: int | None = None,
          limit: int | None = None) -> dict:
    """Pair our step ``i`` (``ours[i]`` accepted drafts) with the engine's step ``i + 1`` and compare
    them between the two ends: past the engine's first step, before our last step, and before the
    first engine step that drafted fewer than ``n_draft`` tokens (``-n`` near). The paired steps past
    that must agree as truncation predicts (``ends_consistent``).

    ``stop_kept``: when a stop token ended our decode, the drafts our last step kept before it. llama.cpp
    stops accepting at an accepted end-of-generation draft and books it as the step's own token
    (``common/sampling.cpp``, ``common_sampler_sample_and_accept_n``), so that step accepts exactly
    that many. ``limit``: compare only our first ``limit`` steps (where the two decodes parted at a
    near-tie, the steps after it decode other tokens)."""
    paired = list(zip(engine[1:], ours))[:limit]
    last = len(ours) - 1
    compared = 0
    for i, (step, _) in enumerate(paired):
        if i == last or step.drafted < n_draft:
            break
        compared = i + 1

    def expected(i: int) -> int:
        # a step llama.cpp drafted shorter holds the first N of the drafts we verified: it accepts
        # min(ours, N) (our last step drafted in full and kept what fit)
        ours_i = stop_kept if i == last and stop_kept is not None else paired[i][1]
        return min(ours_i, paired[i][0].drafted)

    diffs = [i for i in range(compared) if paired[i][0].accepted != paired[i][1]]
    ends = [i for i in range(compared, len(paired)) if paired[i][0].accepted != expected(i)]
    return {"engine": [s.accepted for s in engine], "engine_drafted": [s.drafted for s in engine], "ours": ours,
            "compared_steps": compared, "equal": not diffs, "first_difference": diffs[0] if diffs else None,
            "end_steps": len(paired) - compared, "ends_consistent": not ends,
            "cut_at_divergence": limit is not None and limit < len(ours)}


def steps_before(ours: list[int], token: int) -> int:
    """How many of our steps (``ours[i]`` accepted drafts, ``+ 1`` tokens each, after the prefill's
    token 0) end before token index ``token``."""
    end, n = 1, 0
    for accepted in ours:
        end += accepted + 1
        if end > token:
            break
        n += 1
    return n


# llama.cpp's one-token decode and its verify batch reduce in other orders (and in other kernels than
# PyTorch's), so even in float32 its plain and speculative decodes can part where two tokens are nearly
# tied. Measured (SmolLM2-135M f32, held-out prompts 1-24 x 64 tokens, 2026-12-05): 2 partings of
# llama.cpp's plain decode from its speculative one, at gaps of 0.0006 and 0.0035 in our float32 logits,
# its speculative decode equal to our plain greedy both times. An error in a decode shows at gaps of whole
# logits; 0.05 is 14x the largest gap measured.
NEAR_TIE_LOGITS = 0.05
PARTING_LOOKBACK = 3  # tokens before the texts' parting that may be the tokens'


def first_parting(text: str, tokens: list[int], decode) -> int | None:
    """Index of the first of ``tokens`` whose text leaves ``text`` (None: ``text`` begins with them all)."""
    for k in range(len(tokens)):
        if not text.startswith(decode(tokens[: k + 1])):
            return k
    return None


def tie_gap(logits, ours: int, rest: str, decode, top: int = 8) -> tuple[float | None, str | None]:
    """At a parting: our token's logit minus that of the best other token (of the ``top``) that the
    engine's ``rest`` of text begins with, and that token's text; (None, None) when none fits."""
    import torch

    values, ids = torch.topk(logits, top)
    for value, token in zip(values.tolist(), ids.tolist()):
        piece = decode([token])
        if token != ours and piece and (rest.startswith(piece) or piece.startswith(rest)):
            return float(logits[ours]) - value, piece
    return None, None


def nearest_tie(rows, ours: list[int], engine_text: str, decode, k: int) -> dict:
    """Texts part a token or more after the tokens do ("Echo" + " of" against "Ech" + "oes"): of our
    tokens ``k - PARTING_LOOKBACK .. k`` (``rows[j]``: our logits for token ``j``), the one where a
    token the engine's text goes on with comes closest to ours, with that gap (``near_tie``: within
    :data:`NEAR_TIE_LOGITS`); ``k``, with no gap, when no token fits anywhere."""
    best = {"token": k, "ours": decode([ours[k]]), "engine": None, "gap": None}
    for j in range(max(0, k - PARTING_LOOKBACK), k + 1):
        gap, piece = tie_gap(rows[j], ours[j], engine_text[len(decode(ours[:j])):], decode)
        if gap is not None and (best["gap"] is None or gap < best["gap"]):
            best = {"token": j, "ours": decode([ours[j]]), "engine": piece, "gap": gap}
    return {**best, "near_tie": best["gap"] is not None and best["gap"] <= NEAR_TIE_LOGITS}


def our_tau(tokens: int, steps: int) -> float:
    """Our rule on our decode: tokens past the prefill's over verify steps."""
    return Tally(kept=[tokens - 1], steps=[steps]).tau()


# -- the evaluation --------------------------------------------------------------------------------

def evaluate_prompt(cfg: EngineConfig, prompt: str, n: int, reference: dict | None, baseline: bool) -> dict:
    """One prompt through the engine (and beside our ``reference``: ``{"tokens", "accepted", "plain",
    "text", "plain_text"}``); the per-prompt record of the report."""
    spec = run_speculative(cfg, prompt, n)
    plain = run_plain(cfg, prompt, n) if baseline else None
    # the tokens within -n: the plain decode's count when it ran (a stop token's place is known there)
    kept = plain.tokens if plain is not None else min(n, spec.tokens)
    record = {"engine_tau": engine_tau(spec.steps, kept), "engine_mean_acc_len": spec.mean_acc_len,
              "engine_tokens": spec.tokens, "engine_steps": len(spec.steps), "engine_decode_seconds": spec.seconds,
              "engine_acc_rate_per_pos": spec.acc_rate_per_pos,
              "engine_spec_tokens_per_s": spec.tokens / spec.seconds if spec.seconds else 0.0}
    if plain is not None:
        record.update({"engine_plain_tokens": plain.tokens, "engine_plain_runs": plain.runs,
                       "engine_plain_seconds": plain.seconds,
                       "engine_plain_tokens_per_s": plain.runs / plain.seconds if plain.seconds else 0.0,
                       "engine_lossless": spec.text.startswith(plain.text) and
                       (not plain.ended_by_stop or spec.text == plain.text)})
    if reference is not None:
        spec_parting = reference["parting"]("llama.cpp speculative", spec.text, runs_past=True)
        plain_parting = reference["parting"]("llama.cpp plain", plain.text) if plain is not None else None
        record["partings"] = [p for p in (spec_parting, plain_parting) if p is not None]
        limit = None if spec_parting is None else steps_before(reference["accepted"], spec_parting["token"])
        record["alignment"] = align(spec.steps, reference["accepted"], cfg.n_draft, reference["stop_kept"], limit)
        record["ours_tau"] = our_tau(len(reference["tokens"]), len(reference["accepted"]))
        record["ours_verified_tau"] = tally([book_steps(reference["accepted"], None)]).verified_tau()
        if plain is not None:
            record["engine_plain_equals_ours"] = plain.text == reference["plain_text"]
            # the prompt as llama.cpp tokenized it (its -lv 5 log) against ours; None: not in its log
            record["prompt_ids_equal"] = None if plain.prompt_ids is None else plain.prompt_ids == reference["prompt_ids"]
    record["engine_text"], record["engine_plain_text"] = spec.text, plain.text if plain is not None else None
    return record


def summarize(records: list[dict], n_draft: int) -> dict:
    """Pooled figures over prompts: tau by our rule for both decoders, the engine's own, speeds, verdicts."""
    def pooled(key_tokens, key_steps):
        return Tally(kept=[key_tokens(r) for r in records], steps=[key_steps(r) for r in records]).tau()

    out = {
        "num_prompts": len(records), "n_draft": n_draft,
        "engine_tau": pooled(lambda r: r["engine_tau"]["tau"] * r["engine_tau"]["steps"],
                             lambda r: r["engine_tau"]["steps"]),
        "engine_tau_per_prompt": [r["engine_tau"]["tau"] for r in records],
        # llama.cpp's own figure (its statistics line per run): all its tokens over all its steps
        "engine_mean_acc_len": sum(r["engine_tokens"] for r in records) / max(1, sum(r["engine_steps"] for r in records)),
        "engine_mean_acc_len_per_prompt": [r["engine_mean_acc_len"] for r in records],
        "engine_first_step_accepted": [r["engine_tau"]["first_step"]["accepted"] for r in records],
        "engine_overrun_tokens": [r["engine_tau"]["overrun_tokens"] for r in records],
        "engine_spec_tokens_per_s": sum(r["engine_tokens"] for r in records)
        / max(1e-9, sum(r["engine_decode_seconds"] for r in records)),
    }
    if all("engine_plain_tokens_per_s" in r for r in records):
        # llama-completion times its decode steps (the token after the prefill on), one token each
        out["engine_plain_tokens_per_s"] = sum(r["engine_plain_runs"] for r in records) / max(
            1e-9, sum(r["engine_plain_seconds"] for r in records))
        out["speedup"] = out["engine_spec_tokens_per_s"] / max(1e-9, out["engine_plain_tokens_per_s"])
        out["engine_lossless"] = all(r["engine_lossless"] for r in records)
    if all("alignment" in r for r in records):
        out["ours_tau"] = pooled(lambda r: r["ours_tau"] * len(r["alignment"]["ours"]),
                                 lambda r: len(r["alignment"]["ours"]))
        out["ours_tau_per_prompt"] = [r["ours_tau"] for r in records]
        out["ours_verified_tau_per_prompt"] = [r["ours_verified_tau"] for r in records]
        out["aligned_equal"] = all(r["alignment"]["equal"] for r in records)
        out["aligned_ends_consistent"] = all(r["alignment"]["ends_consistent"] for r in records)
        out["aligned_steps_compared"] = sum(r["alignment"]["compared_steps"] for r in records)
        if all("engine_plain_equals_ours" in r for r in records):
            out["engine_plain_equals_ours"] = all(r["engine_plain_equals_ours"] for r in records)
            out["prompt_ids_equal"] = all(r["prompt_ids_equal"] is not False for r in records)
    if all("partings" in r for r in records):
        out["partings"] = [dict(p, prompt=i + 1) for i, r in enumerate(records) for p in r["partings"]]
        out["partings_near_ties"] = all(p["near_tie"] for p in out["partings"])
    return out


def failed_checks(summary: dict) -> list[str]:
    """The verdicts that failed. A decode that parted from ours only at near-ties (float32 rounding in
    llama.cpp's kernels, :data:`NEAR_TIE_LOGITS`) is reported, not failed."""
    checks = ("aligned_equal", "aligned_ends_consistent")
    if not summary.get("partings_near_ties"):
        checks = ("engine_lossless", "engine_plain_equals_ours", *checks)
    return [k for k in checks if summary.get(k) is False]


def verdict_lines(summary: dict, names) -> list[str]:
    """``name: yes/NO`` for each ``(key, name)`` the summary holds (an engine report's verdicts)."""
    return [f"{name}: {'yes' if summary[key] else 'NO'}" for key, name in names if key in summary]


def format_table(report: dict) -> str:
    """Per prompt: tau both ways, the engine's own figure, the aligned steps; then the totals."""
    s = report["summary"]
    lines = [f"llama.cpp {LLAMA_CPP_VERSION} (-t {report['llama_cpp']['threads']}), B-1 = {s['n_draft']}, "
             f"{report['max_new_tokens']} new tokens, {s['num_prompts']} prompts",
             "prompt | tau llama.cpp (our rule) | tau ours | llama.cpp #mean acc len | first step | "
             "steps compared | equal"]
    for i, r in enumerate(report["prompts"]):
        a = r.get("alignment", {})
        ours = f"{r['ours_tau']:.2f}" if "ours_tau" in r else "-"
        acc = f"{r['engine_mean_acc_len']:.2f}" if r["engine_mean_acc_len"] is not None else "-"
        first = r["engine_tau"]["first_step"]
        lines.append(f"{i + 1} | {r['engine_tau']['tau']:.2f} | {ours} | {acc} | {first['accepted']}/{first['drafted']}"
                     f" | {a.get('compared_steps', '-')} | {a.get('equal', '-')}")
    lines.append(f"tau (tokens past the first / verify steps, pooled): llama.cpp {s['engine_tau']:.3f}" +
                 (f", ours {s['ours_tau']:.3f}" if "ours_tau" in s else "") +
                 f"; llama.cpp's own #mean acc len {s['engine_mean_acc_len']:.3f} (its first step and overrun in)")
    lines.append(f"llama.cpp tok/s: speculative {s['engine_spec_tokens_per_s']:.1f}" +
                 (f", plain {s['engine_plain_tokens_per_s']:.1f}, speedup {s['speedup']:.2f}x"
                  if "engine_plain_tokens_per_s" in s else ""))
    lines += verdict_lines(s, (("engine_lossless", "llama.cpp speculative = llama.cpp plain"),
                               ("engine_plain_equals_ours", "llama.cpp plain = our plain"),
                               ("aligned_equal", "per-step acceptance equal between the ends"),
                               ("aligned_ends_consistent", "at the end, llama.cpp's shortened drafts accept "
                                                          "min(ours, drafted), at a stop token what ours kept")))
    for p in s.get("partings", []):
        gap = "none of our top 8 tokens" if p["gap"] is None else f"{p['gap']:.4f} logits"
        lines.append(f"  prompt {p['prompt']}: {p['decode']} parts from our plain greedy at token {p['token']} "
                     f"({p['ours']!r} ours, {p['engine']!r} its): gap {gap}, "
                     + ("a near-tie" if p["near_tie"] else f"NOT a near-tie (> {NEAR_TIE_LOGITS})"))
    return "\n".join(lines)


def write(report: dict, out: Path) -> Path:
    from dflash_train.files import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    path = out / "eval.json"
    atomic_write_text(path, json.dumps(report, indent=2), "eval report", "free space or choose another --out")
    return path


# -- the command ---------------------------------------------------------------------------------

def _target_gguf(args, out: Path, echo) -> Path:
    """``--target-gguf``, else the target converted once by llama.cpp's own converter into ``out``."""
    from dflash_train.files import verify_sidecar
    from dflash_train.llamacpp.build import convert_with_llamacpp

    if args.target_gguf:
        return Path(args.target_gguf)
    path = out / "target-f32.gguf"
    problem = verify_sidecar(path) if path.is_file() else None
    if problem is not None:  # our own conversion, kept as a cache: converted again
        echo(f"eval: {path} {problem}; converting the target again")
        path.unlink()
    if not path.is_file():
        echo(f"eval: converting the target with llama.cpp's converter into {path} (once; --target-gguf skips it)")
        out.mkdir(parents=True, exist_ok=True)
        convert_with_llamacpp(args.target, path, "f32", log=out / "convert-target.log")
    return path


def _drafter_gguf(args, target_gguf: Path, out: Path, echo) -> Path:
    """``--drafter-gguf``, else the export's ``drafter.gguf``, else one written now (float32) into ``out``."""
    from dflash_train.export.gguf import GGUF_FILE, check_gguf, write_drafter_gguf

    if args.drafter_gguf:
        return check_gguf(args.drafter_gguf, "drafter GGUF")
    if (Path(args.drafter) / GGUF_FILE).is_file():
        return check_gguf(Path(args.drafter) / GGUF_FILE, "drafter GGUF")
    echo(f"eval: writing the drafter's GGUF into {out / GGUF_FILE}")
    out.mkdir(parents=True, exist_ok=True)
    return write_drafter_gguf(args.drafter, target_gguf, out / GGUF_FILE, "float32")


def _reference(target, drafter, ids, n: int, block: int) -> dict:
    """Our reference decodes of one prompt (float32, the Hugging Face loop): speculative and plain."""
    import torch

    from dflash_train.decoding.speculative import speculative_generate, target_generate
    from dflash_train.eval.evaluate import default_stop_token_ids

    stop = default_stop_token_ids(target)
    x = torch.as_tensor(ids, dtype=torch.long).view(1, -1)
    spec = speculative_generate(target, drafter, x, n, block_size=block, stop_token_ids=stop)
    plain = target_generate(target, x, n, stop_token_ids=stop)

    def text(tokens):
        return target.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def parting(decode_name: str, engine_text: str, runs_past: bool = False) -> dict | None:
        """Where an engine's text leaves our plain greedy decode (None: it does not; ``runs_past``:
        the engine may go on past ours), and how close our float32 logits were there."""
        ours = plain.tokens
        k = first_parting(engine_text, ours, text)
        if k is None:
            if runs_past or engine_text == text(ours):
                return None
            return {"decode": decode_name, "token": len(ours), "ours": None, "engine": None, "gap": None,
                    "near_tie": False}
        with torch.no_grad():
            rows = target.model(torch.tensor([list(ids) + ours[:k]])).logits[0, len(ids) - 1:].float()
        return {"decode": decode_name, **nearest_tie(rows, ours, engine_text, text, k)}

    accepted = [a - 1 for a in spec.acceptance_lengths]
    stopped = bool(spec.tokens) and spec.tokens[-1] in stop
    _, kept = kept_steps([a + 1 for a in accepted], len(spec.tokens) - 1)
    return {"tokens": spec.tokens, "accepted": accepted, "plain": plain.tokens,
            "text": text(spec.tokens), "plain_text": text(plain.tokens), "prompt_ids": list(ids),
            "lossless": spec.tokens == plain.tokens, "parting": parting,
            "stop_kept": kept[-1] - 1 if stopped and kept else None}


def run_cli(args) -> int:
    """``dflash-train eval --engine llama.cpp``: checks up front (programs, target architecture), then
    every prompt through llama.cpp and our reference; writes OUT/eval.json, prints the table."""
    import sys

    import torch

    from dflash_train.export.gguf import read_target_gguf, spec_type
    from dflash_train.files import read_json
    from dflash_train.llamacpp import check_hf_target, check_target_architecture
    from dflash_train.llamacpp.build import find_binaries

    def echo(line):
        print(line, file=sys.stderr)

    binaries = find_binaries(args.llama_cpp)
    config = Path(args.target) / "config.json"
    if config.is_file():
        check_hf_target(read_json(config), str(config))
    out = Path(args.out)
    target_gguf = _target_gguf(args, out, echo)
    check_target_architecture(read_target_gguf(target_gguf).architecture, str(target_gguf))
    drafter_gguf = _drafter_gguf(args, target_gguf, out, echo)

    from dflash_train.eval.loader import load_eval_inputs

    target, drafter, ids = load_eval_inputs(args.target, args.drafter, args.prompts, args.limit, "cpu", torch.float32)
    block = args.block_size or drafter.block_size
    cfg = EngineConfig(binaries, target_gguf, drafter_gguf, block - 1, threads=args.threads,
                       spec_type=spec_type(args.drafter), timeout_s=args.request_timeout, log_dir=out / "llama.cpp")
    records = []
    for i, prompt_ids in enumerate(ids):
        reference = _reference(target, drafter, prompt_ids, args.max_new_tokens, block)
        prompt = target.tokenizer.decode(prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        record = evaluate_prompt(cfg, prompt, args.max_new_tokens, reference, not args.no_baseline)
        record.update(ours_lossless=reference["lossless"], ours_text=reference["text"])
        records.append(record)
        echo(f"prompt {i + 1}/{len(ids)}: tau (our rule) llama.cpp {record['engine_tau']['tau']:.2f}, "
             f"ours {record['ours_tau']:.2f}; aligned steps equal: {record['alignment']['equal']}")
    report = {"engine": "llama.cpp", "target": str(args.target), "drafter": str(args.drafter),
              "prompts_file": str(args.prompts), "max_new_tokens": args.max_new_tokens, "block_size": block,
              "llama_cpp": {"version": LLAMA_CPP_VERSION, "programs": str(binaries["llama-completion"].parent),
                            "target_gguf": str(target_gguf), "drafter_gguf": str(drafter_gguf),
                            "threads": args.threads},
              "accounting": __doc__.split("**One accounting.**")[1].split("**Aligned steps.**")[0].strip(),
              "summary": summarize(records, block - 1), "prompts": records}
    path = write(report, out)
    print(format_table(report))
    print(f"wrote {path}")
    s = report["summary"]
    failed = failed_checks(s)
    if failed:
        echo(f"eval --engine llama.cpp: FAILED: {', '.join(failed)} (details per prompt in {path})")
        return 1
    return 0
