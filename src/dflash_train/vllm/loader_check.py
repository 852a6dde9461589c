"""Each kind's export, read by the pinned vLLM's own loader: what lands where, checked on our side.

:mod:`dflash_train.vllm.loader_probe` runs in vLLM's environment: vLLM parses the speculative config,
its registry picks the model class (``qwen3_dflash.py``, ``qwen3_dflash2.py``, ``qwen3_dspark.py``),
the class is built on the CPU and its ``load_weights`` reads our ``model.safetensors``; no runner, so
the kinds whose runner needs a GPU are pinned too. Here every tensor of our file is matched with the
parameter vLLM loaded it into (vLLM fuses ``q/k/v_proj`` into ``qkv_proj`` and ``gate/up_proj`` into
``gate_up_proj``: the rows of each shard, in that order) and compared exactly; a tensor of ours that
landed nowhere (a head vLLM dropped) or a parameter of vLLM's that nothing fed (other than the
target's embedding and lm_head, which vLLM shares) is a failure, and so is a config field vLLM parsed
to another value than the one we meant (the layers it taps, the mask token, the draft length, the
kind's own fields).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from dflash_train.vllm import MODEL_FILES, VLLM_VERSION, VllmError, speculative_config

# vLLM's fused parameters: their shards in our file, stacked along dim 0 in this order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# not ours to feed: the target's embedding and lm_head (vLLM shares them), and vLLM's placeholder for a
# separate mask embedding (unused while ``has_separate_mask_embedding`` is false: it embeds the mask
# token through the target's embedding, as we do)
NOT_OURS = ("embed_tokens", "lm_head", "mask_embedding")


def our_name(vllm_name: str) -> str:
    """vLLM's parameter name -> ours (its ``model.`` prefix dropped)."""
    return vllm_name.removeprefix("model.")


def match_tensors(ours: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor]) -> dict:
    """Pair vLLM's loaded parameters with our tensors (fused ones by their shards) and compare them
    exactly. Returns the names fed and equal, the differing, ours that landed nowhere, and vLLM's
    parameters that nothing fed (:data:`NOT_OURS` aside)."""
    used, equal, differ, unfed = set(), [], [], []
    for name, param in loaded.items():
        base = our_name(name)
        fused = next(((k, v) for k, v in FUSED.items() if f".{k}." in f".{base}"), None)
        sources = [base.replace(fused[0], s) for s in fused[1]] if fused else [base]
        if not all(s in ours for s in sources):
            if not any(part in base for part in NOT_OURS):
                unfed.append(name)
            continue
        used.update(sources)
        expected = torch.cat([ours[s] for s in sources], 0) if fused else ours[base]
        same = tuple(expected.shape) == tuple(param.shape) and torch.equal(expected.float(), param.float())
        (equal if same else differ).append(name)
    return {"equal": sorted(equal), "differ": sorted(differ), "landed_nowhere": sorted(set(ours) - used),
            "unfed": sorted(unfed)}


def expected_fields(config: dict, kind: str, tensor_names=()) -> dict:
    """What vLLM must read from our ``config.json``: the values we meant (field -> value); a confidence
    head is meant where our file holds one (``tensor_names``)."""
    dflash = config["dflash_config"]
    out = {"aux_layer_ids": [i + 1 for i in dflash["target_layer_ids"]], "mask_token_id": dflash["mask_token_id"],
           "num_speculative_tokens": config["block_size"] - 1, "num_layers": config["num_hidden_layers"],
           "use_aux_hidden_state": True,
           # full-attention layers see the whole block; a sliding-window layer is causal inside it (docs/spec.md)
           "causal_layers": [t == "sliding_attention" for t in config.get("layer_types")
                             or ["full_attention"] * config["num_hidden_layers"]],
           "has_separate_mask_embedding": False}
    if kind == "dflash2":
        out["selector_top_k"] = dflash["selector_top_k"]
        out["dflash_config"] = dflash
    if kind == "dspark":
        out.update(markov_rank=config["markov_rank"], markov_head_type="vanilla", sample_from_anchor=False,
                   has_confidence_head=any(n.startswith("confidence_head.") for n in tensor_names))
        if out["has_confidence_head"]:
            out["confidence_head_with_markov"] = True  # ours reads [h ; W1[prev]]
    return out


def _run_probe(python: Path, request: dict, workdir: Path) -> dict:
    request_path, out_path = workdir / "request.json", workdir / "probe.json"
    request_path.write_text(json.dumps(request))
    script = Path(__file__).with_name("loader_probe.py")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run([str(python), str(script), str(request_path), str(out_path)], capture_output=True,
                          text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not out_path.is_file():
        tail = "\n".join(done.stderr.strip().splitlines()[-6:])
        raise VllmError(f"vllm {VLLM_VERSION}: loading {request['drafter']} in vLLM's model class failed "
                        f"(exit {done.returncode}):\n{tail}")
    return json.loads(out_path.read_text())


def check_folder(drafter: str | os.PathLike, target: str | os.PathLike, python: Path | None = None) -> dict:
    """Load ``drafter`` (an export) into vLLM's class for its kind; compare tensors and fields."""
    from safetensors.torch import load_file

    from dflash_train.files import read_json, verify_export
    from dflash_train.models.drafter import CONFIG_FILE, WEIGHTS_FILE, serving_kind
    from dflash_train.vllm.install import find_python

    verify_export(drafter)
    config = read_json(Path(drafter) / CONFIG_FILE)
    kind = serving_kind(config).name
    with tempfile.TemporaryDirectory(prefix="vllm-loader-") as tmp:
        request = {"target": str(target), "drafter": str(drafter), "params_out": str(Path(tmp) / "params.safetensors"),
                   "speculative_config": speculative_config(kind, str(drafter), int(config["block_size"]))}
        probe = _run_probe(python or find_python(), request, Path(tmp))
        loaded = load_file(request["params_out"])
    ours = load_file(str(Path(drafter) / WEIGHTS_FILE))
    tensors = match_tensors(ours, loaded)
    wanted = expected_fields(config, kind, list(ours))
    fields = {k: {"ours": v, "vllm": probe["fields"].get(k)} for k, v in wanted.items()}
    wrong = [k for k, f in fields.items() if f["ours"] != f["vllm"]]
    ok = not (tensors["differ"] or tensors["landed_nowhere"] or tensors["unfed"] or wrong)
    return {"kind": kind, "vllm": VLLM_VERSION, "class": probe["class"], "model_file": MODEL_FILES[kind],
            "speculative_config": request["speculative_config"], "ok": ok, "tensors": tensors,
            "fields": fields, "fields_wrong": wrong}
