"""Load our exported DFlash2 folder in the DFlash authors' ``DFlash2DraftModel`` and compare.

    PYTHONPATH=src python scripts/check_authors_dflash2.py --authors-model PATH/dflash/model.py \
        [--out scripts/check_authors_dflash2.json]

``PATH/dflash/model.py`` is the authors' file (github.com/z-lab/dflash, ``dflash/model.py`` at a
commit that has ``DFlash2DraftModel``; it is imported from that path at run time, never copied
here). On a tiny random Qwen3 target (CPU, float32) and a DFlash2 drafter whose convolutions and
selector are far from their identity start, it checks:

1. block hidden states: the authors' ``forward`` (their keyword call) against our ``DFlashDrafter``;
2. candidates: the top-k ids per slot (as sets: theirs come unsorted);
3. selector scores: the authors' sampled walk (T = 1) gives a path and q rows; our
   ``CandidateSelector.scores`` along the same path must give the same q rows;
4. the greedy path: their ``propose`` at T = 0 against our ``selector_walk``;
5. decoding (after ``--train-steps`` of our DFlash2 objective on the target's own greedy text, so
   drafts get accepted): their ``spec_generate`` (greedy) against our exported model's ``spec_generate``
   and plain greedy decoding on a few prompts: tokens, acceptance lengths and tau.
The numbers are written as JSON (``--out``) and printed.

The committed ``check_authors_dflash2.json`` came from the authors' ``dflash/model.py`` at commit
10129599dffb338ff38cfd235a53ca6d3667b4dd (25,395 characters, fetched as stored public text, placed
outside this repository and imported from that path at run time), with the default ``--train-steps``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from dflash_train.export.serving import export_drafter
from dflash_train.models.config import DrafterConfig, resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.models.kinds.dflash2 import selector_walk
from dflash_train.models.target import Target
from dflash_train.models.tiny import tiny_qwen3

BLOCK = 8
SHAPE = dict(kind="dflash2", conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=6)


def load_authors(path: Path):
    spec = importlib.util.spec_from_file_location("authors_dflash_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "DFlash2DraftModel"):
        raise SystemExit(f"{path}: no DFlash2DraftModel (a commit before DFlash2?)")
    module._cuda_time = time.perf_counter  # their timing helper calls torch.cuda.synchronize; CPU run here
    return module


def build(target: Target, seed: int = 0) -> tuple[DFlashDrafter, DrafterConfig]:
    cfg = resolve_drafter_config(DrafterConfig(num_hidden_layers=2, block_size=BLOCK, target_layer_ids=[0, 2], **SHAPE),
                                 target.facts, mask_token_id=target.facts.vocab_size - 1)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if ("conv" in name or "candidate_selector" in name) else 0.02))
    return drafter.eval(), cfg


def train_briefly(drafter, target: Target, hf_target, steps: int, g) -> list[float]:
    """Our DFlash2 objective on the target's own greedy continuations, so drafts get accepted and
    the acceptance lengths compared below are more than 1s. Returns the first and last losses."""
    from dflash_train.objective.step import ObjectiveOptions, drafter_loss, make_blocks

    prompts = torch.randint(0, 120, (16, 4), generator=g)
    with torch.no_grad():
        ids = hf_target.generate(prompts, max_new_tokens=44, do_sample=False, min_new_tokens=44)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :4] = 0
    features = target.features(ids, torch.ones_like(ids), drafter.config.target_layer_ids)
    opts = ObjectiveOptions(block_size=BLOCK, mask_token_id=drafter.config.mask_token_id, gamma=4.0)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    drafter.train()
    curve = []
    for _ in range(steps):
        anchors = torch.stack([torch.randperm(ids.shape[1] - 5, generator=g)[:12].sort().values + 3 for _ in ids])
        blocks = make_blocks(ids, loss_mask, anchors, torch.ones_like(anchors, dtype=torch.bool), opts)
        out = drafter_loss(drafter, target.embed_tokens, target.lm_head_weight, features, blocks, opts)
        loss = out.weighted_ce / out.weight_sum
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        curve.append(float(loss))
    drafter.eval()
    return [curve[0], curve[-1]]


def compare_states(theirs, ours, cfg, g) -> dict:
    feats = torch.randn(1, 7, 2 * cfg.hidden_size, generator=g)
    embeds = torch.randn(1, BLOCK, cfg.hidden_size, generator=g)
    positions = torch.arange(7 + BLOCK)[None]
    got = theirs(position_ids=positions, noise_embedding=embeds, target_hidden=feats)
    want = ours(embeds, feats, positions[:, 7:], positions[:, :7])
    return {"hidden_max_abs_diff": float((got - want).abs().max()), "hidden_scale": float(want.abs().max())}, want


def compare_selector(theirs, ours, hidden, head, g) -> dict:
    anchor = torch.tensor([5])
    logits = hidden @ head.t()
    their_path, their_cands, _ = theirs.candidate_selector.select(hidden, logits, anchor, 0.0)
    our_path, our_cands, _ = selector_walk(ours.candidate_selector, hidden, logits, anchor)
    same_sets = bool(torch.equal(their_cands.sort(-1).values, our_cands.sort(-1).values))
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    sampled, cands, q_rows = theirs.candidate_selector.select(hidden, logits, anchor, 1.0)
    preds = torch.cat([anchor[:, None], sampled[:, :-1]], dim=1)
    projected = ours.candidate_selector.hidden_projection(hidden)
    scores = ours.candidate_selector.scores(projected, logits.gather(-1, cands), cands, preds)
    our_q = torch.softmax(scores.float(), dim=-1)
    return {"candidate_sets_equal": same_sets, "greedy_path_equal": bool(torch.equal(their_path, our_path)),
            "greedy_path_differs_from_argmax": bool(not torch.equal(our_path, logits.argmax(-1))),
            "q_rows_max_abs_diff": float((our_q - q_rows).abs().max())}


def compare_decoding(authors_model, our_model, hf_target, prompts, new_tokens) -> dict:
    rows = []
    for prompt in prompts:
        theirs = authors_model.spec_generate(hf_target, prompt, new_tokens, None, 0.0)
        stats = _authors_stats(authors_model, hf_target, prompt, new_tokens)
        ours = our_model.spec_generate(hf_target, prompt, new_tokens, None, 0.0, return_stats=True)
        plain = hf_target.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
        n = prompt.shape[1] + new_tokens
        rows.append({"tokens_equal_authors": bool(torch.equal(theirs[:, :n], ours.output_ids[:, :n])),
                     "tokens_equal_plain_greedy": bool(torch.equal(ours.output_ids[:, :n], plain[:, :n])),
                     "authors_acceptance": stats, "our_acceptance": ours.acceptance_lengths})
    def tau(key, last=True):
        return sum(sum(r[key][: None if last else -1]) for r in rows) / sum(len(r[key]) - (not last) for r in rows)

    # The final step differs by rule, not by model: the authors count the tokens kept once the
    # length limit cuts a step (min(accepted + 1, room left)); we count the step's acceptance.
    return {"prompts": rows, "tau_authors": tau("authors_acceptance"), "tau_ours": tau("our_acceptance"),
            "tau_authors_without_final_step": tau("authors_acceptance", last=False),
            "tau_ours_without_final_step": tau("our_acceptance", last=False),
            "acceptance_equal_before_final_step": all(r["authors_acceptance"][:-1] == r["our_acceptance"][:-1]
                                                      for r in rows)}


def _authors_stats(model, target, prompt, new_tokens):
    module = sys.modules[type(model).__module__]
    out = module.dflash_generate(model, target, prompt, new_tokens, None, 0.0, return_stats=True)
    return out.acceptance_lengths


def portable(path: Path) -> str:
    """The authors' file as the report records it: repository-relative inside this checkout, else
    ``<z-lab/dflash checkout>/dflash/model.py``; never one machine's absolute path (a committed report is
    read on other machines; tests/test_no_machine_paths.py fails on such paths)."""
    path, repo = path.resolve(), Path(__file__).resolve().parents[1]
    if path.is_relative_to(repo):
        return str(path.relative_to(repo))
    return "<z-lab/dflash checkout>/" + "/".join(path.parts[-2:])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors-model", type=Path, required=True, help="the authors' dflash/model.py")
    parser.add_argument("--train-steps", type=int, default=200, help="steps of our objective before comparing")
    parser.add_argument("--out", type=Path, default=None, help="write the report here (JSON)")
    args = parser.parse_args(argv)
    authors = load_authors(args.authors_model)
    hf_target = tiny_qwen3(num_layers=4, hidden=64, vocab=128)
    with torch.no_grad():  # sharper logits than HF's 0.02 init, so drafts and acceptance vary
        hf_target.get_input_embeddings().weight.normal_(0.0, 0.5)
    target = Target(hf_target)
    drafter, cfg = build(target)
    g = torch.Generator().manual_seed(1)
    report = {"authors_model": portable(args.authors_model), "shape": {**SHAPE, "block_size": BLOCK}}
    report["train_loss_first_last"] = train_briefly(drafter, target, hf_target, args.train_steps, g)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        folder = export_drafter(drafter, cfg, Path(tmp) / "dflash2", dtype=torch.float32)
        theirs, info = authors.DFlash2DraftModel.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
        theirs.eval()
        report["authors_loading"] = {k: sorted(map(str, v)) for k, v in info.items() if v}
        states, hidden = compare_states(theirs, drafter, cfg, g)
        report["forward"] = states
        report["selector"] = compare_selector(theirs, drafter, hidden[:, 1:], target.lm_head_weight, g)
        from transformers import AutoModel

        ours = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
        prompts = [torch.randint(0, 120, (1, 6 + 3 * i), generator=g) for i in range(4)]
        report["decoding"] = compare_decoding(theirs, ours, hf_target, prompts, new_tokens=24)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
