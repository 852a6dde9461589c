"""GPU check of the batched static backend: greedy agreement with HF generate and tokens/s of both.

    dflash-train bench-generate --target assets/smollm2 --n 1024 --max-new 256

The prompts are the packaged seed prompts (``data.builders.prompts.seed_prompts``); each static
mode (``--modes``) generates after a warm-up that captures its graphs, then HF ``generate``
decodes the first ``--check`` prompts for the agreement count.
"""

from __future__ import annotations

import argparse
import time

import torch

from dflash_train.cli_types import nonnegative_int, positive_int
from dflash_train.decoding.batched import MODES, StaticCacheGenerator
from dflash_train.decoding.generators import HFGenerator, SamplingParams

VARIANTS = ("", "stock", "compact")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The benchmark's flags (numbers range-checked: one line naming the flag)."""
    ap.add_argument("--target", default="assets/smollm2", help="target model folder")
    ap.add_argument("--n", type=positive_int, default=1024, help="prompts to generate for")
    ap.add_argument("--max-new", type=positive_int, default=256, help="new tokens per prompt")
    ap.add_argument("--batch", type=positive_int, default=1024, help="static backend: rows per decode bucket")
    ap.add_argument("--hf-batch", type=positive_int, default=256, help="rows per HF generate call (the agreement check)")
    ap.add_argument("--modes", default="cudagraph,eager",
                    help="comma list of static modes to time; a ':stock' suffix keeps HF's SDPA attention "
                         "(K/V repeated per query head) instead of the grouped decode attention, ':compact' "
                         "continues a bucket's running rows at a smaller batch once half have finished")
    ap.add_argument("--check", type=nonnegative_int, default=64, help="prompts compared with HF greedy")


def register(sub) -> None:
    """``dflash-train bench-generate``."""
    p = sub.add_parser("bench-generate", help="batched static generation vs HF generate: tokens/s and greedy agreement (GPU)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def _modes(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    bad = [m for m in modes if m.partition(":")[0] not in MODES or m.partition(":")[2] not in VARIANTS]
    if bad or not modes:
        raise SystemExit(f"--modes: {bad or text!r} not MODE[:stock|:compact] with MODE one of {MODES}")
    return modes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from dflash_train.data.builders.prompts import PromptSet, seed_prompts

    modes = _modes(args.modes)
    ps = PromptSet()
    for text, source in seed_prompts():
        ps.add(text, source)
    convs = [[{"role": "user", "content": it["text"]}] for it in ps.items[: args.n]]
    params = SamplingParams(max_new_tokens=args.max_new)
    results = {mode: _time_static(args, mode, convs, params) for mode in modes}
    _agreement(args, convs, params, results)
    return 0


def _time_static(args, mode: str, convs, params: SamplingParams):
    """One static mode's answers, timed after a warm-up that captures its graphs."""
    base, _, variant = mode.partition(":")
    g = StaticCacheGenerator(args.target, device="cuda", max_batch=args.batch, mode=base,
                             grouped_attention=variant != "stock", compact=variant == "compact")
    g.generate(convs[: min(64, len(convs))], SamplingParams(max_new_tokens=8))  # warm-up / capture
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = g.generate(convs, params)
    dt = time.perf_counter() - t
    toks = sum(o.num_tokens for o in out)
    print(f"static[{mode}]: {toks} tokens in {dt:.1f}s = {toks / dt:.0f} tok/s "
          f"(prefill {g.stats.prefill_seconds:.1f}s, {g.stats.row_steps} row-steps, "
          f"{g.stats.compactions} compactions)", flush=True)
    return out


def _agreement(args, convs, params: SamplingParams, results: dict) -> None:
    """HF generate on the first ``--check`` prompts: its tokens/s, and how many answers each static mode
    matches exactly."""
    if not args.check:
        return
    hf = HFGenerator(args.target, device="cuda")
    t = time.perf_counter()
    ref = []
    for i in range(0, args.check, args.hf_batch):
        ref += hf.generate(convs[i:min(i + args.hf_batch, args.check)], params)
    dt = time.perf_counter() - t
    toks = sum(o.num_tokens for o in ref)
    print(f"hf generate: {toks} tokens in {dt:.1f}s = {toks / dt:.0f} tok/s (batch {args.hf_batch})")
    for mode, out in results.items():
        same = sum(a.content == b.content for a, b in zip(out[: args.check], ref))
        print(f"greedy agreement static[{mode}] vs hf: {same}/{len(ref)} identical "
              "(bf16: a few late divergences from ties are expected)")


if __name__ == "__main__":
    raise SystemExit(main())
