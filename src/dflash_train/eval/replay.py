"""Replay: the greedy tau of a drafter without running a single verify step.

Greedy speculative decoding is lossless, so whatever the drafter proposes, the committed
tokens are the target's own greedy continuation ``g``. A verify step from the last
committed token ``g_j`` accepts the leading drafts that equal ``g_{j+1}, g_{j+2}, ...``
and commits one more. Given ``g`` (computed once per target and prompt set, then kept in
a file), a whole decode is therefore a walk over ``g``: draft at ``j``, count the
matches ``a``, step to ``j + a + 1``. The drafter's context features for every position
come from one teacher-forced target forward over prompt + ``g``: the verify forwards of
a real decode compute the same numbers in pieces.

What it costs: one drafter call per verify step and no target forward per step (40
SmolLM2 prompts x 128 tokens: seconds instead of the ~50 s of a real decode), so
ablations and curve points can be scored on many prompts. What it does not give:
speed. The numbers that a README reports come from ``eval``; a test pins this walk to
the real loop step by step (same acceptance lengths, same drafts).

``g`` runs ``max_new_tokens + block_size`` tokens past each prompt, ignoring stop
tokens: the real loop verifies a block that may cross the end (or a stop token) and
counts its accepted drafts before cutting, and the walk does the same.

    dflash-train replay --target T --drafter D --prompts heldout --limit 24 \\
        --max-new-tokens 128 --dtype float32 --references refs.json --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

from dflash_train.cli_types import positive_int
from dflash_train.decoding.core import (
    GREEDY,
    SpecResult,
    block_chooser,
    choose_independently,
    leading_matches,
    speculative_loop,
)
from dflash_train.decoding.proposers import as_proposer, block_hidden, block_logits, drafter_setting
from dflash_train.decoding.speculative import target_generate
from dflash_train.eval.evaluate import REPORT_TODO, default_stop_token_ids, summarize
from dflash_train.files import (
    UNSEALED,
    UserFacingError,
    atomic_write_text,
    explained,
    note_once,
    read_text,
    seal_json,
    unseal_json,
)


# ---------------------------------------------------------------------------------------
# the target's greedy continuations (computed once, kept in a file)
# ---------------------------------------------------------------------------------------
def references_key(target_name: str, dtype: torch.dtype, prompts: list[torch.Tensor], length: int) -> str:
    """What a continuation depends on: the target, its dtype, the prompt ids, the length."""
    digest = hashlib.sha256()
    for ids in prompts:
        digest.update(torch.as_tensor(ids).flatten().numpy().astype("int64").tobytes())
        digest.update(b"|")
    return f"{target_name}|{str(dtype).removeprefix('torch.')}|{length}|{digest.hexdigest()[:16]}"


def greedy_references(target, prompts: list[torch.Tensor], length: int, engine: str = "hf",
                      drafter=None) -> list[list[int]]:
    """``length`` greedy tokens after each prompt, stop tokens ignored.

    ``engine`` "static" decodes with :class:`~dflash_train.decoding.static.StaticDecoder`
    (CUDA graphs: ~3x faster than "hf" on an H200 for SmolLM2), "hf" with the reference
    loop. Both are the plain decodes that ``eval`` checks speculative output against.
    The static decoder is built around a drafter (its buffers), which its plain steps
    never call.
    """
    if engine == "static":
        from dflash_train.decoding.static import StaticDecoder

        longest = max(int(p.shape[-1]) for p in prompts)
        if drafter is None:
            raise ValueError("the static engine needs the drafter (for its buffers)")
        span = longest + length + int(drafter.block_size) + 1  # the decoder reserves one block past the end
        decoder = StaticDecoder(target, drafter, max_len=-(-span // 64) * 64)
        return [decoder.plain(p.view(1, -1), length, ()).tokens for p in prompts]
    return [target_generate(target, p.view(1, -1), length).tokens for p in prompts]


def load_or_make_references(path: str | Path | None, key: str, make) -> list[list[int]]:
    """The continuations stored at ``path`` under ``key``; made (and stored) when absent.

    The file is written atomically (a failure: one line, an earlier file intact, no temp);
    one that cannot be read or is not a references file is one line naming it, not remade
    over (it may be the wrong path, and making them costs a decode of every prompt). It carries
    its own checksum (``files.seal_json``): token ids changed after the write but still ints
    would score every replay against a wrong decode, so a mismatch remakes them (a note); a file
    written before the checksum is read as it is (a note, once)."""
    if path is not None and (Path(path).exists() or Path(path).is_symlink()):
        stored = _read_references(Path(path))
        if stored.get("damaged"):
            print(f"replay: {path} {stored['damaged']}: remaking them", file=sys.stderr)
        elif stored.get("key") == key:
            return stored["continuations"]
        else:
            print(f"replay: {path} holds continuations for {stored.get('key')!r}, not {key!r}: remaking them",
                  file=sys.stderr)
    continuations = make()
    if path is not None:
        with explained("cannot write replay references", Path(path).parent, REFERENCES_TODO):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, seal_json({"key": key, "continuations": continuations}), "replay references",
                          REFERENCES_TODO)
    return continuations


REFERENCES_TODO = "free space or choose another --references"


def _read_references(path: Path) -> dict:
    """``{"key": str, "continuations": [[int, ...], ...]}`` from ``path``, ``{"damaged": why}`` when
    its checksum does not match, or one line."""
    try:
        stored, problem = unseal_json(read_text(path, "replay references"))
        if problem == UNSEALED:
            note_once(f"replay: note: {path} carries no checksum (written by an older version); read as it is")
        elif problem is not None:
            return {"damaged": problem}
    except UserFacingError:
        raise
    except (ValueError, RecursionError) as err:
        raise ValueError(f"replay references {path}: not JSON ({getattr(err, 'msg', 'nested too deeply')}); "
                         "remove it to make them again") from None
    continuations = stored.get("continuations") if isinstance(stored, dict) else None
    if not isinstance(continuations, list) or not all(
            isinstance(c, list) and all(isinstance(t, int) for t in c) for c in continuations):
        raise ValueError(f"replay references {path}: not a references file (a key and lists of token ids); "
                         "remove it to make them again")
    return stored


# ---------------------------------------------------------------------------------------
# the walk
# ---------------------------------------------------------------------------------------
def walk(sequence: list[int], prompt_len: int, max_new_tokens: int, num_draft: int, stop: set[int],
         accepted_at) -> SpecResult:
    """The verify steps of a greedy decode over ``sequence`` (prompt + the target's greedy
    tokens): ``accepted_at(p)`` is how many drafts from the block anchored at position
    ``p`` match; it is called for increasing ``p``, as a real decode would draft. The steps run
    through the one speculative loop (:func:`~dflash_train.decoding.core.speculative_loop`), so
    they stop, cut and count as a real decode's."""
    return speculative_loop(_WalkSteps(sequence, prompt_len, accepted_at), None, max_new_tokens, num_draft + 1,
                            stop)


class _WalkSteps:
    """Replay's engine steps (:class:`~dflash_train.decoding.core.SpecSteps`): the prefill's token
    and every verify are read from the stored greedy continuation; drafting is ``accepted_at``."""

    def __init__(self, sequence: list[int], prompt_len: int, accepted_at) -> None:
        self.sequence, self.prompt_len, self.accepted_at = sequence, prompt_len, accepted_at

    def prefill(self, _input_ids) -> int:
        return self.sequence[self.prompt_len]

    def draft(self, generated: list[int]) -> int:
        return self.prompt_len + len(generated) - 1  # the last committed token's position

    def verify(self, p: int) -> tuple[int, int]:
        return p, self.accepted_at(p)

    def accept(self, pending: tuple[int, int]) -> tuple[list[int], int, int]:
        p, accepted = pending
        return self.sequence[p + 1: p + 1 + accepted], accepted, self.sequence[p + 1 + accepted]

    def keep(self, accepted: int) -> None:
        pass  # a stored continuation has no cache to crop


def _checked_sequence(prompt: torch.Tensor, continuation: list[int], max_new_tokens: int, num_draft: int):
    if len(continuation) < max_new_tokens + num_draft + 1:
        raise ValueError(f"continuation has {len(continuation)} tokens; the walk needs "
                         f"max_new_tokens + block_size = {max_new_tokens + num_draft + 1}")
    prompt = prompt.view(-1).tolist()
    return prompt + list(continuation), len(prompt)


def _features(target, layer_ids: list[int], sequence: list[int], length: int):
    """Teacher-forced features of ``sequence[:length]`` [1, length, n*h] (None: no layers)."""
    if not layer_ids:
        return None
    ids = torch.tensor([sequence[:length]], device=target.device)
    return target.forward_with_features(layer_ids, input_ids=ids, use_cache=False)[1]


@torch.no_grad()
def replay_one(target, proposer, prompt: torch.Tensor, continuation: list[int], max_new_tokens: int,
               num_draft: int, stop: set[int]) -> SpecResult:
    """One prompt's greedy speculative decode, replayed over ``continuation`` (the
    target's greedy tokens, at least ``max_new_tokens + num_draft + 1`` of them): the
    proposer drafts exactly as in a real decode (its cache fed step by step)."""
    sequence, prompt_len = _checked_sequence(prompt, continuation, max_new_tokens, num_draft)
    proposer = as_proposer(target, proposer)
    features = _features(target, list(proposer.feature_layer_ids), sequence, prompt_len + max_new_tokens + num_draft)
    proposer.reset()
    fed = [0]  # context positions whose features the proposer has

    def accepted_at(p: int) -> int:
        if not num_draft:
            return 0
        new_features = features[:, fed[0]:p] if features is not None else None
        fed[0] = p
        drafts = proposer.propose_block(sequence[: p + 1], new_features, num_draft, GREEDY).tokens.tolist()
        return leading_matches(drafts, sequence[p + 1: p + 1 + num_draft])

    return walk(sequence, prompt_len, max_new_tokens, num_draft, stop, accepted_at)


@torch.no_grad()
def block_states(target, drafter, sequence: list[int], anchors: list[int], num_draft: int) -> torch.Tensor:
    """[len(anchors), num_draft, hidden]: the drafter's output states for the draft
    positions of the block anchored at each of ``anchors``, in one forward as training runs
    it (all blocks side by side under the dense DFlash mask: block ``a`` sees the context
    features of positions ``< a`` and itself)."""
    from dflash_train.models.attention import build_masks

    cfg = drafter.config
    block, device = num_draft + 1, target.device
    context_len = max(anchors)
    features = _features(target, list(drafter_setting(cfg, "target_layer_ids")), sequence, context_len)
    anchor_t = torch.tensor([anchors], device=device)
    masks = build_masks("sdpa", drafter.layer_types, anchor_t, torch.ones_like(anchor_t, dtype=torch.bool),
                        context_len, block, drafter.sliding_window)
    ids = torch.full((len(anchors), block), int(drafter_setting(cfg, "mask_token_id")), dtype=torch.long,
                     device=device)
    ids[:, 0] = torch.tensor([sequence[a] for a in anchors], device=device)
    positions = (anchor_t.view(-1, 1) + torch.arange(block, device=device)).view(1, -1)
    hidden = block_hidden(target, drafter, ids.view(1, -1), features, positions,
                          torch.arange(context_len, device=device)[None], masks)
    return hidden.view(len(anchors), block, -1)[:, 1:]


def all_acceptances(target, drafter, sequence: list[int], anchors: list[int], num_draft: int,
                    lm_head_rows: int = 4096) -> list[int]:
    """Accepted drafts of the block anchored at each of ``anchors`` (:func:`block_states`,
    then the target's lm_head in chunks of rows: never all logits at once)."""
    states = block_states(target, drafter, sequence, anchors, num_draft)
    choose = block_chooser(drafter)
    with torch.no_grad():
        if choose is choose_independently:  # DFlash: every slot's argmax, the lm_head over many rows at once
            rows = states.reshape(-1, states.shape[-1])
            drafts = torch.cat([block_logits(target, chunk).argmax(-1)
                                for chunk in rows.split(lm_head_rows)]).view(len(anchors), num_draft).tolist()
        else:  # a drafter with its own chooser (a path over candidates): block by block
            drafts = [choose(h, block_logits(target, h), torch.tensor([sequence[a]], device=h.device),
                             GREEDY).tokens.tolist() for h, a in zip(states, anchors)]
    return [leading_matches(d, sequence[a + 1: a + 1 + num_draft]) for d, a in zip(drafts, anchors)]


def replay_one_batched(target, drafter, prompt: torch.Tensor, continuation: list[int], max_new_tokens: int,
                       num_draft: int, stop: set[int]) -> SpecResult:
    """:func:`replay_one` with every anchor's drafts from :func:`all_acceptances` (one
    drafter forward per prompt instead of one per verify step)."""
    sequence, prompt_len = _checked_sequence(prompt, continuation, max_new_tokens, num_draft)
    anchors = list(range(prompt_len, prompt_len + max_new_tokens))
    accepted = dict(zip(anchors, all_acceptances(target, drafter, sequence, anchors, num_draft))) if num_draft \
        else {}
    return walk(sequence, prompt_len, max_new_tokens, num_draft, stop, lambda p: accepted.get(p, 0))


def replay(target, drafter, prompts: list[torch.Tensor], continuations: list[list[int]], max_new_tokens: int,
           block_size: int | None = None, stop_token_ids=None, batched: bool = False) -> dict:
    """The ``eval`` report's tau fields (mean tau, per prompt, histogram, per position),
    from walks over ``continuations``; ``engine`` is "replay" and there is no timing.
    ``batched``: all of a prompt's blocks in one drafter forward (a DFlash drafter only)."""
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    proposer = as_proposer(target, drafter)
    block = int(proposer.block_size if block_size is None else block_size)
    stop = set(default_stop_token_ids(target) if stop_token_ids is None else map(int, stop_token_ids))
    was_training = getattr(drafter, "training", False)
    if was_training:
        drafter.eval()
    try:
        one = (lambda p, c: replay_one_batched(target, drafter, p, c, max_new_tokens, block - 1, stop)) if batched \
            else (lambda p, c: replay_one(target, proposer, p, c, max_new_tokens, block - 1, stop))
        results = [one(torch.as_tensor(p), c) for p, c in zip(prompts, continuations)]
    finally:
        if was_training:
            drafter.train()
    report = summarize(results, None, block)
    for key in ("spec_decode_tokens_per_s", "spec_draft_time_s", "spec_verify_time_s", "ms_per_draft_step",
                "ms_per_verify_step"):
        report.pop(key, None)
    report.update({"engine": "replay-batched" if batched else "replay", "max_new_tokens": max_new_tokens, "temperature": 0.0,
                   "stop_token_ids": sorted(stop), "lossless": {"checked": False, "ok": None},
                   "prompts": [{"prompt_tokens": int(torch.as_tensor(p).numel()), "new_tokens": len(r.tokens),
                                "tau": r.mean_tau, "kept_lengths": r.kept_lengths,
                                "acceptance_lengths": r.acceptance_lengths}
                               for p, r in zip(prompts, results)]})
    return report


# ---------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model folder")
    parser.add_argument("--drafter", required=True, help="DFlash serving-format folder")
    parser.add_argument("--prompts", required=True, help="as for eval (a file, heldout or selection)")
    parser.add_argument("--limit", type=positive_int, default=None, help="only the first N prompts (N >= 1)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens per prompt to walk over")
    parser.add_argument("--block-size", type=positive_int, default=None, help="default: the drafter's")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="dtype of target and drafter (the continuations are keyed by it)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--references", default=None,
                        help="JSON file of the target's continuations: read when it matches, else made and written")
    parser.add_argument("--reference-engine", choices=("auto", "hf", "static"), default="auto",
                        help="plain decoding for the continuations (auto: static on CUDA)")
    parser.add_argument("--batched", action="store_true",
                        help="every block of a prompt in one drafter forward (training's dense mask) instead of "
                             "drafting step by step as a real decode does: faster, same tau up to float rounding")
    parser.add_argument("--only-references", action="store_true",
                        help="make (or check) the --references file and stop")
    parser.add_argument("--out", required=True, help="folder for eval.json (the eval report's tau fields)")


def register(sub) -> None:
    """``dflash-train replay``."""
    p = sub.add_parser("replay", help="greedy tau of a drafter from the target's stored continuations (no verify steps; fast ablations)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"replay: error: {err}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    from dflash_train.devices import resolve_device
    from dflash_train.eval.loader import load_eval_inputs

    device = str(resolve_device(args.device, "--device"))
    dtype = getattr(torch, args.dtype)
    target, drafter, ids = load_eval_inputs(args.target, args.drafter, args.prompts, args.limit, device, dtype)
    prompts = [torch.as_tensor(p) for p in ids]
    block = int(args.block_size or drafter.block_size)
    if block > drafter.block_size:
        raise ValueError(f"--block-size {block}: above the drafter's block size {drafter.block_size}")
    length = args.max_new_tokens + block
    engine = args.reference_engine if args.reference_engine != "auto" else (
        "static" if device.startswith("cuda") else "hf")
    key = references_key(Path(args.target).name, dtype, prompts, length)
    continuations = load_or_make_references(args.references, key,
                                            lambda: greedy_references(target, prompts, length, engine, drafter))
    if args.only_references:
        print(f"replay: continuations of {len(prompts)} prompts in {args.references}")
        return 0
    report = replay(target, drafter, prompts, continuations, args.max_new_tokens, block, batched=args.batched)
    report.update({"target": args.target, "drafter": args.drafter, "prompts_file": args.prompts,
                   "dtype": args.dtype, "device": device})
    out = write_replay_report(report, args.out)
    print(f"replay: {len(prompts)} prompts, mean tau {report['mean_tau']:.3f}, "
          f"per position {' '.join(f'{a:.2f}' for a in report['per_position_acceptance'][:6] if a is not None)}"
          f" -> {out}")
    return 0


def write_replay_report(report: dict, out_dir: str | Path) -> Path:
    """``OUT/eval.json``, atomically: a failure is one line naming it, an earlier report intact."""
    out = Path(out_dir)
    with explained("cannot write the replay report folder", out, REPORT_TODO):
        out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "eval.json", json.dumps(report, indent=2), "replay report", REPORT_TODO)
    return out / "eval.json"


if __name__ == "__main__":
    raise SystemExit(main())
