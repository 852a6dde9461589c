"""Test helpers: tiny drafters, chat data and jobs, proposers and graph-capture fakes.

Imported by tests as ``from testkit import ...`` (``tests/`` is on ``sys.path`` through its
conftest). Not part of the package: nothing under ``src/`` may import it.
"""

from __future__ import annotations

import random

import torch

from dflash_train.models.tiny import tiny_qwen3  # noqa: F401  (re-exported for tests)


def tiny_drafter(target, num_layers=2, block_size=4, layer_types=None, sliding_window=None, seed=0, **kw):
    """A resolved drafter for ``target`` (a ``Target``) with every weight perturbed."""
    from dflash_train.models.config import DrafterConfig, resolve_drafter_config
    from dflash_train.models.drafter import DFlashDrafter

    cfg = DrafterConfig(num_hidden_layers=num_layers, block_size=block_size, layer_types=layer_types,
                        sliding_window=sliding_window, **kw)
    cfg = resolve_drafter_config(cfg, target.facts, mask_token_id=target.facts.vocab_size - 1)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(cfg)
    for p in drafter.parameters():  # norms start at 1; perturb so tests see every weight
        p.data.add_(0.02 * torch.randn_like(p))
    return drafter, cfg


STORY_WORDS = "the cat sat on a mat and looked at the big red dog while it ran around the green park".split()  # noqa: SIM905


def write_chat_data(path, n: int = 48):
    """Repetitive assistant text: a drafter learns it fast, so a falling loss is a real signal.

    Written atomically: several ranks of a distributed test may write it at once.
    """
    import json
    import os
    from pathlib import Path

    path = Path(path)
    lines = []
    for i in range(n):
        answer = " ".join(STORY_WORDS[(i + k) % len(STORY_WORDS)] for k in range(40 + i % 7))
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"Tell me story {i}."},
                                              {"role": "assistant", "content": answer}]}))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def tiny_chat_target(tokenizer_path):
    """A tiny random Qwen3 with a real chat tokenizer (its vocabulary size) as a ``Target``."""
    from transformers import AutoTokenizer

    from dflash_train.models.target import Target

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    model = tiny_qwen3(num_layers=6, hidden=64, vocab=len(tokenizer), tie=True)
    with torch.no_grad():  # HF's init (std 0.02) gives near-uniform logits; real models are sharper
        model.get_input_embeddings().weight.normal_(0.0, 0.5)
    return Target(model, tokenizer)


def tiny_chat_job(tmp_path, objective: dict | None = None, **train_overrides) -> dict:
    """A complete job config (dict) training a 1-layer B=4 drafter on ``write_chat_data``
    (``objective``: the ``objective:`` section, default the paper's)."""
    from pathlib import Path

    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = write_chat_data(tmp_path / "train.jsonl")
    return {
        "target": {"path": "unused-when-passed-in", "dtype": "float32"},
        "drafter": {"num_hidden_layers": 1, "block_size": 4, "num_target_features": 2},
        "data": {"paths": [str(data)], "max_length": 128, "token_budget": 256, "pad_to_multiple": 32,
                 "cache_dir": str(tmp_path / "cache")},
        "optim": {"lr": 1e-2, "warmup_ratio": 0.1},
        "train": {"run_dir": str(tmp_path / "run"), "device": "cpu", "max_steps": 16, "num_anchors": 8,
                  "log_every": 1, "progress": False, "loggers": ["jsonl", "tensorboard"], **train_overrides},
        "objective": dict(objective or {}),
    }


def random_prompts(n: int, seed: int = 0, vocab: int = 128) -> list[torch.Tensor]:
    """``n`` prompts [1, 1..12] of random ids below ``vocab - 1`` (the last id stays free)."""
    rng = random.Random(seed)
    return [torch.tensor([[rng.randrange(vocab - 1) for _ in range(rng.randint(1, 12))]]) for _ in range(n)]


def one_hot_logits(tokens, vocab: int = 128):
    """Logits [n, vocab] whose argmax is ``tokens`` (what an oracle drafter returns)."""
    logits = torch.full((len(tokens), vocab), -10.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 10.0
    return logits


class NoisyCheckedProposer:
    """Runs the real DFlash proposer (so its cache is exercised and checked against a
    cache-free forward over all context), then overrides its drafts with the greedy
    continuation corrupted at random positions: acceptance lengths vary from 1 to B."""

    def __init__(self, target, drafter, prompt_len, continuation, seed=0, p_wrong=0.25):
        from dflash_train.decoding.speculative import DFlashProposer

        self.inner = DFlashProposer(target, drafter)
        self.target, self.drafter = target, drafter
        self.feature_layer_ids, self.block_size = self.inner.feature_layer_ids, self.inner.block_size
        self.prompt_len, self.continuation = prompt_len, continuation
        self.rng, self.p_wrong = random.Random(seed), p_wrong
        self.checked = 0

    def reset(self):
        self.inner.reset()

    def propose(self, tokens, new_features, num_draft):
        vocab = self.target.lm_head_weight.shape[0]
        logits = self.inner.propose(tokens, new_features, num_draft)
        p = len(tokens) - 1
        all_features = self.target.features(torch.tensor([tokens[:p]]), None, self.feature_layer_ids)
        block = torch.tensor([[tokens[-1]] + [self.inner.mask_token_id] * num_draft])
        hidden = self.drafter(self.target.embed(block), all_features, torch.arange(p, p + num_draft + 1)[None],
                              torch.arange(p)[None])
        reference = hidden[0, 1:] @ self.target.lm_head_weight.T
        torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)
        self.checked += 1
        g = len(tokens) - self.prompt_len
        want = (self.continuation[g:] + [0] * num_draft)[:num_draft]
        want = [(t + 1) % vocab if self.rng.random() < self.p_wrong else t for t in want]
        return one_hot_logits(want, vocab)


def _copy_into(outs, fresh):
    if isinstance(outs, torch.Tensor):
        outs.copy_(fresh)
    elif isinstance(outs, tuple | list):
        for o, f in zip(outs, fresh):
            _copy_into(o, f)
    elif hasattr(outs, "__dataclass_fields__"):
        for name in vars(outs):
            _copy_into(getattr(outs, name), getattr(fresh, name))


class ReplayedStep:
    """What ``dry_capture`` returns: ``replay()`` runs the recorded step as a CUDA graph would,
    gradients overwritten (zeroed in place first, not accumulated), outputs written in place."""

    def __init__(self, fn, outputs, params):
        self.fn, self.outputs, self.params = fn, outputs, params

    def replay(self):
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()
        _copy_into(self.outputs, self.fn())


def dry_capture(params, optimizer, extra=()):
    """A CPU stand-in for ``train/cuda_graphs.capture_step``: ``capture(fn)`` runs ``fn`` once to
    learn its outputs, then puts back what it changed (parameters, optimizer state, ``extra``
    tensors, no gradients), because a CUDA capture records the step without running it."""
    import copy

    params = list(params)

    def capture(fn):
        saved = [p.detach().clone() for p in params]
        saved_extra = [t.clone() for t in extra]
        state = copy.deepcopy(optimizer.state_dict())
        outputs = fn()
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
                p.grad = None
            for t, s in zip(extra, saved_extra):
                t.copy_(s)
        optimizer.load_state_dict(state)
        return ReplayedStep(fn, outputs, params), outputs

    return capture


def fp8_drafter_grads(device: str, fp8: bool, compile: bool, hidden: int = 128) -> tuple[torch.Tensor, dict]:
    """One forward and backward (autocast bf16) of a 2-layer drafter for a tiny target, through
    the trainer's application point (``parallelize_drafter``: FP8 projections, then compile):
    the output and every parameter's gradient. Emulated FP8 off CUDA."""
    from dflash_train.models.target import Target
    from dflash_train.train.parallelize import parallelize_drafter

    torch._dynamo.reset()
    target = Target(tiny_qwen3(num_layers=6, hidden=hidden).to(device))
    drafter, cfg = tiny_drafter(target, num_layers=2)
    drafter.to(device)
    model = parallelize_drafter(drafter, False, compile, fp8=fp8, fp8_emulate=device == "cpu")
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(2, 64, hidden, generator=g).to(device)
    feats = torch.randn(2, 96, hidden * len(cfg.target_layer_ids), generator=g).to(device)
    qpos, cpos = torch.arange(96, 160).expand(2, -1).to(device), torch.arange(96).expand(2, -1).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = model(embeds, feats, qpos, cpos)
    out.float().square().mean().backward()
    return out.detach().float(), {n: p.grad for n, p in drafter.named_parameters()}


def train_stopping_at(cfg, stop_at: int, target) -> None:
    """Train the job ``cfg`` (a ``JobConfig``) but stop after step ``stop_at`` the way a SIGTERM would:
    the loop saves and ends early."""
    from dflash_train.train import trainer as trainer_mod
    from dflash_train.train.loop import train

    original_run = trainer_mod.Trainer.run

    def run_until_stop(self, on_step_end=None):
        def hook(t):
            if on_step_end:
                on_step_end(t)
            if t.counters.step == stop_at:
                t.stop_requested = True
        return original_run(self, hook)

    trainer_mod.Trainer.run = run_until_stop
    try:
        train(cfg, target=target, echo=lambda *a: None)
    finally:
        trainer_mod.Trainer.run = original_run


def train_stopped_then_resumed(job: dict, stop_at: int, target_factory) -> None:
    """Train ``job`` (a config dict), stopped after step ``stop_at`` (:func:`train_stopping_at`), then
    resume it with ``train.resume=auto`` to its end: the run folder then holds what an interrupted and
    resumed run writes. ``target_factory()`` gives a fresh target each time."""
    from dflash_train.config import config_from_dict
    from dflash_train.train.loop import train

    train_stopping_at(config_from_dict(job), stop_at, target_factory())
    resumed = config_from_dict({**job, "train": {**job["train"], "resume": "auto"}})
    train(resumed, target=target_factory(), echo=lambda *a: None)
