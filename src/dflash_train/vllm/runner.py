"""Run inside vLLM's own environment: ``VLLM_PYTHON runner.py REQUEST.json OUT.json``.

This file imports vLLM and the standard library only (it is executed by the python of the vLLM
environment, which has no ``dflash_train``). It reads a request (the target and drafter folders,
token-id prompts, the decode length), and decodes every prompt greedily twice with vLLM's offline
``LLM`` API: plain (no drafter) and speculative (``speculative_config``), one engine after the other
in this process, so the two are timed alike. It writes, per prompt and decode: the token ids, the
finish reason, the seconds of the request, and for the speculative one:

- vLLM's per-request acceptance (``per_request_spec_decode_metrics="detailed"``, vLLM >= 0.32):
  the accepted and drafted tokens of each verify step, in order;
- the difference of vLLM's cumulative counters (``llm.get_metrics()``: ``vllm:spec_decode_num_drafts``,
  ``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``) around
  the request: vLLM's own figures.

Settings vLLM's CPU build needs: ``enforce_eager=True`` (no graph capture on a CPU),
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; its default is sized for servers), and this module's
``__main__`` guard (the engine core is started by spawn and re-imports the main module).
"""

from __future__ import annotations

import json
import os
import sys
import time

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def progress(line: str) -> None:
    """A line in ``$DFLASH_ENGINE_PROGRESS`` (when set): the parent's per-request timeout starts again
    (``dflash_train.engine_process``). Before and after vLLM starts, and before every request."""
    path = os.environ.get("DFLASH_ENGINE_PROGRESS")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


def counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters (0 before its first draft)."""
    out = {name: 0 for name in COUNTERS}
    out[PER_POS] = []
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            out[metric.name] += int(metric.value)
        elif metric.name == PER_POS:
            values = list(metric.values)
            old = out[PER_POS] + [0] * (len(values) - len(out[PER_POS]))
            out[PER_POS] = [a + int(b) for a, b in zip(old, values)]
    return out


def difference(after: dict, before: dict) -> dict:
    out = {name: after[name] - before[name] for name in COUNTERS}
    before_pos = before[PER_POS] + [0] * (len(after[PER_POS]) - len(before[PER_POS]))
    out[PER_POS] = [a - b for a, b in zip(after[PER_POS], before_pos)]
    return out


def make_llm(request: dict, speculative: bool):
    from vllm import LLM

    kwargs = dict(model=request["target"], dtype=request.get("dtype", "float32"), enforce_eager=True,
                  max_model_len=request.get("max_model_len", 1024), max_num_seqs=1, seed=0,
                  disable_log_stats=False)
    if speculative:
        kwargs.update(speculative_config=request["speculative_config"], per_request_spec_decode_metrics="detailed")
    return LLM(**kwargs)


def spec_metrics(output) -> dict | None:
    """The per-request acceptance vLLM attached to the finished output (None: it attached none)."""
    found = getattr(output.outputs[0], "spec_decode_metrics", None)
    if found is None:
        return None
    return {"per_step_accepted": list(found.per_step_accepted), "per_step_drafted": list(found.per_step_drafted),
            "histogram": list(found.histogram), "num_draft_tokens": int(found.num_draft_tokens)}


def decode_all(llm, request: dict, speculative: bool) -> list[dict]:
    """Every prompt, one request at a time (a warm-up request first: the first one pays for setup)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"], ignore_eos=False)
    kind = "speculative" if speculative else "plain"
    progress(f"{kind}: the warm-up request")
    llm.generate([TokensPrompt(prompt_token_ids=request["prompts"][0])],
                 SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    records = []
    for i, ids in enumerate(request["prompts"]):
        progress(f"{kind}: request {i + 1}/{len(request['prompts'])}")
        before = counters(llm) if speculative else None
        started = time.perf_counter()
        output = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        seconds = time.perf_counter() - started
        record = {"tokens": list(output.outputs[0].token_ids), "finish_reason": output.outputs[0].finish_reason,
                  "seconds": seconds}
        if speculative:
            time.sleep(request.get("metrics_settle_s", 0.0))
            record["counters"] = difference(counters(llm), before)
            record["request_metrics"] = spec_metrics(output)
        records.append(record)
    return records


def run(request: dict) -> dict:
    import vllm

    out = {"vllm_version": vllm.__version__}
    for name, speculative in (("plain", False), ("speculative", True)):
        if name == "plain" and not request.get("baseline", True):
            continue
        started = time.perf_counter()
        progress(f"{name}: vLLM to start")
        llm = make_llm(request, speculative)
        out[f"{name}_startup_seconds"] = time.perf_counter() - started
        out[name] = decode_all(llm, request, speculative)
        out[f"{name}_total_counters"] = counters(llm) if speculative else None
        del llm
    return out


def main(argv: list[str]) -> int:
    request_path, out_path = argv[1], argv[2]
    with open(request_path) as fh:
        request = json.load(fh)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(request)
    with open(out_path + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(out_path + ".tmp", out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
