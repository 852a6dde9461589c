"""Real acceptance length on held-out prompts, measured during training.

Training accuracy can look fine while serving acceptance is near 1 (shifted labels,
a leaky mask); so every ``eval.every`` steps, and before and after training, the
trainer decodes a few held-out prompts with the drafter and the target together and
logs tau next to the loss. Only rank 0 evaluates; the others wait at a barrier.

Decoding runs the drafter eagerly: its layers are compiled for training's static
shapes, and a decoding context that grows by a few tokens per step would recompile
them at every length until dynamo's recompile limit (seen on an H200 in every
in-training evaluation before this was done).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dflash_train.config import EvalConfig
from dflash_train.data.prompt_sets import resolve_prompts
from dflash_train.data.prompts import encode_prompts, read_prompts
from dflash_train.eval.evaluate import EvalOptions, evaluate


class HeldoutEvaluator:
    """``eval.prompts`` encoded once with the target's tokenizer; called with the trainer."""

    def __init__(self, cfg: EvalConfig, tokenizer):
        path = resolve_prompts(cfg.prompts)  # a file, or a named set such as "heldout"
        prompts = read_prompts(path, limit=cfg.num_prompts)
        self.prompt_ids = encode_prompts(tokenizer, prompts)
        self.max_new_tokens = cfg.max_new_tokens
        self.source = str(path)
        self.history: list[dict] = []
        self.evaluated: tuple[int, float | None] | None = None  # (step, tau) of the latest call, every rank

    def __call__(self, trainer) -> float | None:
        """Mean tau (greedy) at the trainer's current step; None on non-main ranks. The caller
        logs it (``train/loop.py``, ``heldout_tau``)."""
        tau = None
        if trainer.ranks.is_main:
            step = trainer.counters.step
            trainer.echo(f"step {step} | held-out evaluation: speculative decoding of {len(self.prompt_ids)} prompts "
                         f"never trained on, up to {self.max_new_tokens} new tokens each")
            with torch.compiler.set_stance("force_eager"):  # no tracing, no new graphs
                options = EvalOptions(max_new_tokens=self.max_new_tokens, baseline=False, lossless_check=False,
                                      warmup=False, echo=lambda line: trainer.echo(f"  held-out {line}"))
                report = evaluate(trainer.target, trainer.drafter, self.prompt_ids, options)
            tau = report["mean_tau"]
            record = {"step": trainer.counters.step, "tau": tau,
                      "per_position_acceptance": report["per_position_acceptance"]}
            self.history.append(record)
            trainer.echo(f"step {trainer.counters.step} | held-out tau {tau:.3f} on {len(self.prompt_ids)} prompts")
        if dist.is_available() and dist.is_initialized():
            dist.barrier(group=trainer.ranks.group)  # the drafter ranks only
        return tau

