"""What the engine tests (``tests/llamacpp``, ``tests/vllm``) serve: drafters made here on the CPU.

- :func:`random_serving_folder`: an export of a random drafter of each kind, every tensor distinct
  (norms included), so a swapped or dropped tensor shows in a loader comparison;
- :func:`write_answers` and :func:`train_memorized`: SmolLM2's own greedy answers to three held-out
  prompts, and a 1-layer, B = 8 drafter (the cpu-demo recipe) trained 100 steps to memorize them, so
  that it accepts; its features are computed once (1 step per epoch) and cached. The drafters memorize
  answers to held-out prompts on purpose: the loader's decontamination is off here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PROMPTS = [  # the first three held-out prompts; the drafters learn the target's answers to them
    "What are three good habits for staying productive while working from home?",
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about autumn leaves.",
]
ANSWER_TOKENS, NEW_TOKENS = 48, 40
TRAIN = ["train.num_anchors=8", "data.max_length=128", "train.feature_cache=device", "eval.prompts=null",
         "train.log_every=50", "train.max_steps=100", "data.exclude_eval_prompts=false"]
KINDS = {"dflash": [], "dflash2": ["drafter.kind=dflash2", "objective.weighting=dpace"],
         "dspark": ["drafter.kind=dspark", "drafter.options.markov_rank=64"]}


def random_serving_folder(kind: str, smollm2_path: Path, out: Path, **config) -> Path:
    """A random drafter of ``kind`` for SmolLM2 (2 layers, B = 8, target layers 1, 7, 13; ``config``: more
    ``DrafterConfig`` fields), exported in float32."""
    from transformers import AutoConfig

    from dflash_train.export.serving import export_drafter
    from dflash_train.models.config import DrafterConfig, resolve_drafter_config
    from dflash_train.models.drafter import DFlashDrafter
    from dflash_train.models.target import target_facts

    options = {"markov_rank": 32} if kind == "dspark" else {}
    cfg = resolve_drafter_config(DrafterConfig(num_hidden_layers=2, block_size=8, target_layer_ids=[1, 7, 13],
                                               kind=kind, options=options, **config),
                                 target_facts(AutoConfig.from_pretrained(smollm2_path)), 3)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.05)  # every tensor distinct (norms included), so a swapped name shows
    return export_drafter(drafter, cfg, out, dtype=torch.float32)


def write_answers(smollm2_path: Path, path: Path) -> Path:
    """SmolLM2's own greedy answers to :data:`PROMPTS`, as a chat file to train on."""
    from dflash_train.data.prompts import encode_prompts
    from dflash_train.decoding.speculative import target_generate
    from dflash_train.models.target import Target

    target = Target.load(str(smollm2_path), dtype=torch.float32, device="cpu")
    with open(path, "w") as fh:
        for prompt, ids in zip(PROMPTS, encode_prompts(target.tokenizer, [[{"role": "user", "content": p}]
                                                                          for p in PROMPTS])):
            tokens = target_generate(target, torch.tensor([ids]), ANSWER_TOKENS).tokens
            answer = target.tokenizer.decode(tokens, skip_special_tokens=True)
            fh.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": answer}]}) + "\n")
    return path


def train_memorized(kind: str, smollm2_path: Path, answers: Path, run: Path) -> Path:
    """Train the memorizing drafter of ``kind`` into ``run`` (the command line a user would type)."""
    from dflash_train.cli import main

    assert main(["train", "cpu-demo", f"target.path={smollm2_path}", f"data.paths=[{answers}]",
                 f"train.run_dir={run}", *TRAIN, *KINDS[kind]]) == 0
    return run


def prompts_file(path: Path) -> Path:
    path.write_text("\n".join(PROMPTS) + "\n")
    return path
