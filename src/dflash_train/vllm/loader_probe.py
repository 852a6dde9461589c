"""Run inside vLLM's own environment: ``VLLM_PYTHON loader_probe.py REQUEST.json OUT.json``.

Loads an exported drafter the way vLLM's engine does, without its model runner (so also for the kinds
whose runner needs a GPU): vLLM's ``EngineArgs`` build the configuration (its speculative-config
parsing: the method, the architecture it maps our folder to, ``num_speculative_tokens``), vLLM's model
registry picks the class, the class is built on the CPU and its own ``load_weights`` reads our
``model.safetensors``. It reports, for the comparison on our side (:mod:`dflash_train.vllm.loader_check`):

- ``class``: the class vLLM resolved (``qwen3_dflash``, ``qwen3_dflash2``, ``qwen3_dspark`` module);
- ``params``: every parameter of the built model with its shape; the tensors as loaded go to
  ``params_out`` (a safetensors file);
- ``fields``: the config values the drafting code reads (the layers it taps, the mask token, the block,
  the kind's own fields), as vLLM parsed them.

Standard library and vLLM only: this file runs under vLLM's python, which has no ``dflash_train``.
"""

from __future__ import annotations

import json
import os
import sys


def _init_single_process() -> None:
    """vLLM's layers ask the tensor-parallel group for their shard: a group of one, on gloo."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method="tcp://127.0.0.1:29517",
                                 backend="gloo")
    initialize_model_parallel(1, 1)


def _fields(model, vllm_config) -> dict:
    hf = vllm_config.speculative_config.draft_model_config.hf_config
    inner = model.model
    dflash = dict(getattr(hf, "dflash_config", None) or {})
    fields = {
        "method": vllm_config.speculative_config.method,
        "architectures": list(getattr(hf, "architectures", None) or []),
        "num_speculative_tokens": vllm_config.speculative_config.num_speculative_tokens,
        "aux_layer_ids": list(getattr(hf, "eagle_aux_hidden_state_layer_ids", None) or []),
        "mask_token_id": getattr(inner, "mask_token_id", None),
        "use_aux_hidden_state": getattr(inner, "use_aux_hidden_state", None),
        "num_layers": len(inner.layers),
        "dflash_config": dflash,
        "causal_layers": list(model.get_draft_attn_causal()),
        "has_separate_mask_embedding": getattr(inner, "has_separate_mask_embedding", None),
    }
    for name in ("markov_rank", "markov_head_type", "sample_from_anchor", "enable_confidence_head",
                 "confidence_head_with_markov", "draft_vocab_size", "block_size"):
        fields[name] = getattr(hf, name, None)
    fields["has_confidence_head"] = getattr(inner, "confidence_head", None) is not None
    selector = getattr(inner, "candidate_selector", None)
    fields["selector_top_k"] = getattr(selector, "top_k", None)
    return fields


def probe(request: dict) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.registry import ModelRegistry

    # No runner is built here: vLLM's check that its CPU (V1) runner can draft this kind would refuse
    # DFlash2 and DSpark before their class loads, so it is skipped (eval --engine vllm keeps it).
    VllmConfig._validate_v1_model_runner = lambda self: None
    args = EngineArgs(model=request["target"], dtype="float32", enforce_eager=True, max_model_len=256,
                      speculative_config=request["speculative_config"])
    vllm_config = args.create_engine_config()
    draft = vllm_config.speculative_config.draft_model_config
    cls, arch = ModelRegistry.resolve_model_cls(draft.architectures, draft)
    # ... and a drafter mixing sliding and full attention is built only for the V2 runner: say it is one
    # (read when the class is built, after the configuration was checked)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    with set_current_vllm_config(vllm_config):
        _init_single_process()
        with torch.device("cpu"):
            model = cls(vllm_config=vllm_config, prefix="")
        model.load_weights(load_file(os.path.join(request["drafter"], "model.safetensors")).items())
    from safetensors.torch import save_file

    params = {name: p.detach().contiguous().clone() for name, p in model.named_parameters()}
    save_file(params, request["params_out"])
    return {"class": f"{cls.__module__}.{cls.__name__}", "architecture": arch,
            "params": {name: list(p.shape) for name, p in params.items()}, "fields": _fields(model, vllm_config)}


def main(argv: list[str]) -> int:
    with open(argv[1]) as fh:
        request = json.load(fh)
    result = probe(request)
    with open(argv[2] + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(argv[2] + ".tmp", argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
