"""Generation backends for ``regenerate`` and prompt generation (whole conversations in, text out).

They live with the decoding engines (the static-cache backend is :mod:`.batched`), below the
data layer that calls them: ``data`` -> ``decoding``, never back.

``Generator`` is the seam for faster engines: a backend takes whole conversations
(prompts ending before an assistant turn) and returns the new assistant text with its
token count. ``HFGenerator`` uses batched ``transformers`` ``generate`` with left padding;
a vLLM or SGLang backend only needs to implement ``generate`` the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from dflash_train.devices import resolve_device, resolve_dtype


@dataclass
class SamplingParams:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 -> greedy
    top_p: float = 1.0
    thinking: bool | None = None  # passed to the template as enable_thinking when set


@dataclass
class Generation:
    content: str
    reasoning: str | None
    num_tokens: int


def split_reasoning(text: str) -> tuple[str, str | None]:
    """Separate a ``<think>...</think>`` block the model produced from the answer."""
    if "</think>" not in text:
        return text.strip(), None
    head, _, tail = text.partition("</think>")
    return tail.strip(), head.split("<think>")[-1].strip()


class Generator(ABC):
    @abstractmethod
    def generate(self, prompts: list[list[dict]], params: SamplingParams) -> list[Generation]:
        """One new assistant turn for each conversation prefix, in order."""


class HFGenerator(Generator):
    """Batched Hugging Face ``generate`` on one device."""

    def __init__(self, path: str, dtype: str = "auto", device: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = str(resolve_device(device, "--device"))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not self.tokenizer.chat_template:
            raise ValueError(f"target tokenizer at {path} has no chat template")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=self._dtype(dtype)).to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos if eos is not None else self.tokenizer.eos_token_id]
        self.stop_ids = {int(e) for e in eos if e is not None}

    def _dtype(self, name: str) -> torch.dtype:
        return resolve_dtype(name, self.device)

    def _render(self, messages: list[dict], params: SamplingParams) -> str:
        extra = {} if params.thinking is None else {"enable_thinking": params.thinking}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)

    @torch.inference_mode()
    def generate(self, prompts: list[list[dict]], params: SamplingParams) -> list[Generation]:
        texts = [self._render(p, params) for p in prompts]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        sample = params.temperature > 0
        kwargs = {"do_sample": sample, "temperature": params.temperature, "top_p": params.top_p} if sample else {
            "do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        out = self.model.generate(**enc, max_new_tokens=params.max_new_tokens,
                                  pad_token_id=self.tokenizer.pad_token_id, **kwargs)
        return [self._decode(row[enc["input_ids"].shape[1]:].tolist()) for row in out]

    def _decode(self, new_ids: list[int]) -> Generation:
        stop = next((i for i, t in enumerate(new_ids) if t in self.stop_ids), None)
        kept = new_ids if stop is None else new_ids[:stop]
        n = len(new_ids) if stop is None else stop + 1
        text = self.tokenizer.decode(kept, skip_special_tokens=False)
        content, reasoning = split_reasoning(text)
        return Generation(content, reasoning, n)
