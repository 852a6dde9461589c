"""GPU check of the static backend: greedy agreement with HF generate and tokens/s of both.

    python src/dflash_train/recipes/smollm2/bench_gen.py --target assets/smollm2 --n 1024 --max-new 256
"""

from __future__ import annotations

import argparse
import time

import torch

from dflash_train.data.generators import HFGenerator, SamplingParams
from dflash_train.decoding.batched import StaticCacheGenerator
from dflash_train.recipes.prompts import PromptSet, seed_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="assets/smollm2")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--hf-batch", type=int, default=256)
    ap.add_argument("--modes", default="cudagraph,eager",
                    help="comma list of static modes to time; a ':stock' suffix keeps HF's SDPA attention "
                         "(K/V repeated per query head) instead of the grouped decode attention, ':compact' "
                         "continues a bucket's running rows at a smaller batch once half have finished")
    ap.add_argument("--check", type=int, default=64, help="prompts compared with HF greedy")
    args = ap.parse_args()
    ps = PromptSet()
    for text, source in seed_prompts():
        ps.add(text, source)
    convs = [[{"role": "user", "content": it["text"]}] for it in ps.items[: args.n]]
    params = SamplingParams(max_new_tokens=args.max_new)
    results = {}
    for mode in args.modes.split(","):
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
        results[mode] = out
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
    main()
