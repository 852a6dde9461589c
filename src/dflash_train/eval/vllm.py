"""``dflash-train eval --engine vllm``: what vLLM serves, measured and set beside our decoder.

For each prompt (chat template applied by the target's tokenizer; vLLM gets the token ids), two greedy
decodes in vLLM and two of ours, float32:

- vLLM's plain greedy decode (no drafter): its tokens/s, and the lossless reference in the engine;
- vLLM's speculative decode (``speculative_config``: the method of the drafter's kind, B - 1 drafts),
  with vLLM's per-request acceptance (``per_request_spec_decode_metrics="detailed"``, vLLM >= 0.32:
  accepted and drafted tokens of every verify step) and its cumulative counters read around the request;
- our reference loop (``--engine hf``): plain greedy and speculative.

Both run in :mod:`dflash_train.vllm.runner`, in vLLM's own environment (a subprocess).

**One accounting.** vLLM decodes as we do: its prefill emits the first new token, and each verify step
accepts some of the B - 1 drafts and adds the target's own token. So vLLM's step ``i`` is ours, and
tau by our rule (tokens committed per verify step, the prefill's token excluded, a step cut by the token
budget or a stop token counting what it kept) is read from its per-step acceptance. vLLM's own figure,
"mean acceptance length" (1 + accepted / drafts, from its counters), is our tau *as verified*: every
accepted draft counts, also those past the budget (vLLM 0.32 drafts full blocks up to the end, as our
decoder does, and both keep what fits).

**Aligned steps.** Before our last step, and before any vLLM step that drafted fewer than B - 1 tokens
(the budget near), the accepted drafts of vLLM's step ``i`` and ours must be equal; past that, vLLM's
step accepts ``min(ours, drafted)``. A difference on a drafter that accepts is a bug to find.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from dflash_train.decoding.core import Tally, book_steps, tally
from dflash_train.eval.llamacpp import (
    NEAR_TIE_LOGITS,
    EngineStep,
    align,
    steps_before,
    verdict_lines,
)
from dflash_train.vllm import VLLM_VERSION, VllmError, check_cpu_kind, speculative_config


def run_engine(python: Path, request: dict, log: Path, timeout: float = 600.0) -> dict:
    """:mod:`dflash_train.vllm.runner` in vLLM's environment on ``request``, its output kept in ``log``; its
    JSON result. ``timeout``: seconds for vLLM to start, and then to answer each request (the runner marks
    its progress). A failure (a crash, out of memory, no answer in time, no result) is one line naming vLLM,
    the cause, the log and its last lines; the runner's process group (vLLM's engine core) never outlives it."""
    from dflash_train.engine_process import failure, run_engine_process
    from dflash_train.vllm import runner
    from dflash_train.vllm.install import INSTALL_HINT

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default is sized for a server
    engine = f"vLLM {VLLM_VERSION}"
    with tempfile.TemporaryDirectory(prefix="vllm-eval-") as tmp:
        request_path, out_path = Path(tmp) / "request.json", Path(tmp) / "out.json"
        request_path.write_text(json.dumps(request))
        run_engine_process([str(python), runner.__file__, str(request_path), str(out_path)], engine=engine,
                           what="the runner", log=log, timeout=timeout, env=env, progress=Path(tmp) / "progress",
                           hint=INSTALL_HINT, error=VllmError)
        if not out_path.is_file():
            raise failure(engine, "the runner", "exited without writing its result", log, VllmError)
        return json.loads(out_path.read_text())


# -- one accounting --------------------------------------------------------------------------------

def tau_by_our_rule(accepted: list[int], new_tokens: int) -> dict:
    """Steps accepting ``accepted[i]`` drafts (``+ 1`` tokens each) after the prefill's token, booked by
    our rule (:func:`~dflash_train.decoding.core.book_steps`): the steps that produce tokens
    2..``new_tokens``, each with what it kept."""
    counted = tally([book_steps(accepted, new_tokens)])
    return {"tau": counted.tau(), "steps": counted.num_steps, "kept": sum(counted.kept)}


def as_verified(accepted: list[int], n_draft: int | None = None) -> Tally:
    """Every step booked uncut: the acceptance as verified (vLLM's own figures count it so)."""
    return tally([book_steps(accepted, None, None if n_draft is None else n_draft + 1)])


def per_position(accepted: list[int], n_draft: int) -> list[float]:
    """Per draft position: steps that accepted it / steps (not conditional on the positions before)."""
    return as_verified(accepted, n_draft).position_shares()


def engine_own(counters: dict, n_draft: int) -> dict:
    """vLLM's own figures from its counters: mean acceptance length (1 + accepted / drafts) and the
    accepted share per draft position."""
    drafts = counters["vllm:spec_decode_num_drafts"]
    accepted = counters["vllm:spec_decode_num_accepted_tokens"]
    pos = counters["vllm:spec_decode_num_accepted_tokens_per_pos"][:n_draft]
    return {"drafts": drafts, "accepted": accepted, "draft_tokens": counters["vllm:spec_decode_num_draft_tokens"],
            "mean_acceptance_length": 1 + accepted / drafts if drafts else 0.0,
            "per_position": [p / drafts if drafts else 0.0 for p in pos]}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (one a prefix of the other: its length)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_gap(target, prompt_ids: list[int], ours: list[int], k: int, theirs: int) -> float | None:
    """Our float32 logit of our token ``k`` minus that of the engine's token there (a near-tie: small)."""
    import torch

    if k >= len(ours):
        return None
    with torch.no_grad():
        row = target.model(torch.tensor([list(prompt_ids) + ours[:k]])).logits[0, -1].float()
    return float(row[ours[k]] - row[theirs])


def parting(target, prompt_ids, ours: list[int], theirs: list[int], name: str) -> dict | None:
    """Where an engine's tokens leave our plain greedy decode, with our logit gap there (None: they don't)."""
    k = first_difference(ours, theirs)
    if k is None:
        return None
    gap = logit_gap(target, prompt_ids, ours, k, theirs[k]) if k < len(theirs) else None
    return {"decode": name, "token": k, "gap": gap, "near_tie": gap is not None and abs(gap) <= NEAR_TIE_LOGITS}


# -- the evaluation --------------------------------------------------------------------------------

def evaluate_prompt(plain: dict | None, spec: dict, reference: dict, n_draft: int, target) -> dict:
    """One prompt: vLLM's decodes (runner records) beside ours (``eval.llamacpp._reference``)."""
    steps = spec["request_metrics"] or {}
    accepted = list(steps.get("per_step_accepted", []))
    drafted = list(steps.get("per_step_drafted", []))
    own = engine_own(spec["counters"], n_draft)
    record = {"engine_tokens": len(spec["tokens"]), "engine_seconds": spec["seconds"],
              "engine_accepted": accepted, "engine_drafted": drafted, "engine_own": own,
              "engine_tau": tau_by_our_rule(accepted, len(spec["tokens"])),
              "engine_verified_tau": as_verified(accepted).verified_tau(),
              "counters_equal_request_metrics": own["drafts"] == len(accepted) and own["accepted"] == sum(accepted),
              "ours_accepted": reference["accepted"], "ours_lossless": reference["lossless"],
              "ours_tau": tau_by_our_rule(reference["accepted"], len(reference["tokens"]))["tau"],
              "ours_verified_tau": as_verified(reference["accepted"]).verified_tau(),
              "engine_equals_ours": spec["tokens"] == reference["tokens"]}
    ids = reference["prompt_ids"]
    spec_parting = parting(target, ids, reference["plain"], spec["tokens"], "vLLM speculative")
    partings = [spec_parting]
    if plain is not None:
        record.update(engine_plain_tokens=len(plain["tokens"]), engine_plain_seconds=plain["seconds"],
                      engine_lossless=spec["tokens"] == plain["tokens"],
                      engine_plain_equals_ours=plain["tokens"] == reference["plain"])
        partings.append(parting(target, ids, reference["plain"], plain["tokens"], "vLLM plain"))
    record["partings"] = [p for p in partings if p is not None]
    limit = None if spec_parting is None else steps_before(reference["accepted"], spec_parting["token"])
    engine_steps = [EngineStep(0, n_draft, -1)] + [EngineStep(a, d, -1) for a, d in zip(accepted, drafted)]
    record["alignment"] = align(engine_steps, reference["accepted"], n_draft, reference["stop_kept"], limit)
    return record


def _pooled(records: list[dict], key: str) -> float:
    return Tally(kept=[r[key]["kept"] for r in records], steps=[r[key]["steps"] for r in records]).tau()


def summarize(records: list[dict], n_draft: int) -> dict:
    """Pooled figures over prompts: tau by our rule for both decoders, vLLM's own, speeds, verdicts."""
    engine_acc = [a for r in records for a in r["engine_accepted"]]
    ours_acc = [a for r in records for a in r["ours_accepted"]]
    drafts = sum(r["engine_own"]["drafts"] for r in records)
    out = {
        "num_prompts": len(records), "n_draft": n_draft,
        "engine_tau": _pooled(records, "engine_tau"),
        "ours_tau": Tally(kept=[r["ours_tau"] * len(r["ours_accepted"]) for r in records],
                          steps=[len(r["ours_accepted"]) for r in records]).tau(),
        "engine_verified_tau": as_verified(engine_acc).verified_tau(),
        "ours_verified_tau": as_verified(ours_acc).verified_tau(),
        "engine_mean_acceptance_length": 1 + sum(r["engine_own"]["accepted"] for r in records) / max(1, drafts),
        "engine_per_position": [sum(r["engine_own"]["per_position"][i] * r["engine_own"]["drafts"] for r in records)
                                / max(1, drafts) for i in range(n_draft)],
        "engine_per_position_per_step": per_position(engine_acc, n_draft),
        "ours_per_position": per_position(ours_acc, n_draft),
        "engine_drafts": drafts, "engine_accepted": sum(r["engine_own"]["accepted"] for r in records),
        "ours_drafts": len(ours_acc), "ours_accepted": sum(ours_acc),
        "counters_equal_request_metrics": all(r["counters_equal_request_metrics"] for r in records),
        "engine_spec_tokens_per_s": sum(r["engine_tokens"] for r in records)
        / max(1e-9, sum(r["engine_seconds"] for r in records)),
        "aligned_equal": all(r["alignment"]["equal"] for r in records),
        "aligned_ends_consistent": all(r["alignment"]["ends_consistent"] for r in records),
        "aligned_steps_compared": sum(r["alignment"]["compared_steps"] for r in records),
        "engine_equals_ours": all(r["engine_equals_ours"] for r in records),
        "partings": [dict(p, prompt=i + 1) for i, r in enumerate(records) for p in r["partings"]],
    }
    out["partings_near_ties"] = all(p["near_tie"] for p in out["partings"])
    if all("engine_plain_seconds" in r for r in records):
        out["engine_plain_tokens_per_s"] = sum(r["engine_plain_tokens"] for r in records) / max(
            1e-9, sum(r["engine_plain_seconds"] for r in records))
        out["speedup"] = out["engine_spec_tokens_per_s"] / max(1e-9, out["engine_plain_tokens_per_s"])
        out["engine_lossless"] = all(r["engine_lossless"] for r in records)
        out["engine_plain_equals_ours"] = all(r["engine_plain_equals_ours"] for r in records)
    return out


def failed_checks(summary: dict) -> list[str]:
    """The verdicts that failed; a decode that parted from ours only at float32 near-ties is reported."""
    checks = ("aligned_equal", "aligned_ends_consistent", "counters_equal_request_metrics")
    if not summary.get("partings_near_ties"):
        checks = ("engine_lossless", "engine_plain_equals_ours", *checks)
    return [k for k in checks if summary.get(k) is False]


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


def format_table(report: dict) -> str:
    """Per prompt: tau both ways, vLLM's own figure, drafts and accepted both ways; then the totals."""
    s = report["summary"]
    lines = [f"vLLM {report['vllm']['version']} (CPU), B-1 = {s['n_draft']}, {report['max_new_tokens']} new tokens, "
             f"{s['num_prompts']} prompts",
             "prompt | tau vLLM (our rule) | tau ours | vLLM mean acceptance length | drafts vLLM/ours | "
             "accepted vLLM/ours | steps compared | equal"]
    for i, r in enumerate(report["prompts"]):
        own = r["engine_own"]
        lines.append(f"{i + 1} | {r['engine_tau']['tau']:.2f} | {r['ours_tau']:.2f} | "
                     f"{own['mean_acceptance_length']:.2f} | {own['drafts']}/{len(r['ours_accepted'])} | "
                     f"{own['accepted']}/{sum(r['ours_accepted'])} | {r['alignment']['compared_steps']} | "
                     f"{r['alignment']['equal']}")
    lines += [f"tau (our rule, pooled): vLLM {s['engine_tau']:.3f}, ours {s['ours_tau']:.3f}; as verified: vLLM "
              f"{s['engine_verified_tau']:.3f}, ours {s['ours_verified_tau']:.3f}; vLLM's own mean acceptance length "
              f"{s['engine_mean_acceptance_length']:.3f}",
              f"drafts / accepted: vLLM {s['engine_drafts']} / {s['engine_accepted']}, ours {s['ours_drafts']} / "
              f"{s['ours_accepted']}",
              f"per position accepted/drafts: vLLM {_fmt(s['engine_per_position'])}; ours {_fmt(s['ours_per_position'])}",
              f"vLLM tok/s: speculative {s['engine_spec_tokens_per_s']:.1f}" +
              (f", plain {s['engine_plain_tokens_per_s']:.1f}, speedup {s['speedup']:.2f}x"
               if "engine_plain_tokens_per_s" in s else "")]
    lines += verdict_lines(s, (("engine_lossless", "vLLM speculative = vLLM plain"),
                               ("engine_plain_equals_ours", "vLLM plain = our plain"),
                               ("engine_equals_ours", "vLLM speculative = our speculative"),
                               ("aligned_equal", "per-step acceptance equal between the ends"),
                               ("aligned_ends_consistent", "at the end, vLLM's steps accept min(ours, drafted)"),
                               ("counters_equal_request_metrics", "vLLM's counters = its per-request steps")))
    for p in s["partings"]:
        gap = "-" if p["gap"] is None else f"{p['gap']:.4f} logits"
        lines.append(f"  prompt {p['prompt']}: {p['decode']} parts from our plain greedy at token {p['token']}: gap "
                     f"{gap}, " + ("a near-tie" if p["near_tie"] else f"NOT a near-tie (> {NEAR_TIE_LOGITS})"))
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------------------

def drafter_kind(drafter: str | os.PathLike) -> tuple[str, int, list[str]]:
    """(kind, block size, layer types) of an exported drafter, from its ``config.json`` alone (nothing loads)."""
    from dflash_train.files import read_json
    from dflash_train.models.drafter import CONFIG_FILE, serving_kind

    config = read_json(Path(drafter) / CONFIG_FILE)
    return serving_kind(config).name, int(config["block_size"]), list(config.get("layer_types") or [])


def run_cli(args) -> int:
    """``dflash-train eval --engine vllm``: checks up front (vLLM installed, the kind runs here), then every
    prompt through vLLM (one subprocess) and our reference; writes OUT/eval.json, prints the table."""
    import torch

    from dflash_train.eval.llamacpp import _reference, write
    from dflash_train.eval.loader import load_eval_inputs
    from dflash_train.vllm.install import find_python

    kind, block, layer_types = drafter_kind(args.drafter)
    check_cpu_kind(kind, str(args.drafter), layer_types)
    python = find_python()
    if args.block_size and args.block_size != block:
        raise ValueError(f"--engine vllm: vLLM drafts the drafter's block ({block}); --block-size {args.block_size} "
                         "is not served")
    target, drafter, ids = load_eval_inputs(args.target, args.drafter, args.prompts, args.limit, "cpu", torch.float32)
    request = {"target": str(args.target), "prompts": [list(map(int, p)) for p in ids],
               "max_new_tokens": args.max_new_tokens, "baseline": not args.no_baseline,
               "speculative_config": speculative_config(kind, str(args.drafter), block)}
    print(f"eval: {len(ids)} prompts through vLLM {VLLM_VERSION} ({python})", file=sys.stderr)
    result = run_engine(python, request, Path(args.out) / "vllm.log", args.request_timeout)
    records = []
    for i, prompt_ids in enumerate(ids):
        reference = _reference(target, drafter, prompt_ids, args.max_new_tokens, block)
        plain = result["plain"][i] if "plain" in result else None
        records.append(evaluate_prompt(plain, result["speculative"][i], reference, block - 1, target))
    report = {"engine": "vllm", "target": str(args.target), "drafter": str(args.drafter),
              "prompts_file": str(args.prompts), "max_new_tokens": args.max_new_tokens, "block_size": block,
              "vllm": {"version": result["vllm_version"], "speculative_config": request["speculative_config"],
                       "startup_seconds": {k: result.get(f"{k}_startup_seconds") for k in ("plain", "speculative")}},
              "accounting": __doc__.split("**One accounting.**")[1].split("**Aligned steps.**")[0].strip(),
              "summary": summarize(records, block - 1), "prompts": records}
    path = write(report, Path(args.out))
    print(format_table(report))
    print(f"wrote {path}")
    failed = failed_checks(report["summary"])
    if failed:
        print(f"eval --engine vllm: FAILED: {', '.join(failed)} (details per prompt in {path})", file=sys.stderr)
        return 1
    return 0
