"""``dflash-train bench-fp8-features``: how far an FP8 target's context features move from bf16.

    dflash-train bench-fp8-features --target assets/smollm2 --data greedy-0.jsonl --rows 64

A drafter trained on an FP8 target's features (``target.fp8_linear``) is served next to the bf16
target, so what matters is how far the features it learned from sit from the ones it will see. This
runs the same real text through the target twice, as loaded (bf16) and with its decoder layers'
linears as FP8 matmuls (``models/fp8.py``; where the device has no FP8 tensor cores, the float32
emulation of the same quantization), and reports per feature layer:

- ``rel_error``: ||f8 - f|| / ||f|| over all tokens (the Frobenius norms of the two [tokens, hidden]
  matrices): the share of the feature signal that FP8 changed;
- ``cosine_mean`` and ``cosine_p01``: the cosine between each token's two feature vectors, averaged
  and at the 1st percentile (the worst tokens, which a mean hides).

The text is ``--data`` (chat records, rendered with the target's chat template: prompt and answer, as
training sees them) or, without it, the held-out prompts. One JSON object on stdout (and ``--out``).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from dflash_train.cli_types import comma_separated_ints, positive_int


def register(sub) -> None:
    p = sub.add_parser("bench-fp8-features", help="an FP8 target's context features against bf16: relative "
                       "error and cosine per feature layer (one JSON object)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="assets/smollm2", help="target model folder (or folder/file.gguf)")
    p.add_argument("--data", nargs="*", default=None,
                   help="chat-record files (JSONL/Parquet, the training data); default: the held-out prompts")
    p.add_argument("--rows", type=positive_int, default=64, help="records (or prompts) to run")
    p.add_argument("--max-length", type=positive_int, default=512, help="tokens per row at most")
    p.add_argument("--layer-ids", type=comma_separated_ints, default=None,
                   help="feature layers, e.g. 1,10,18,27 (default: the spec's rule for --num-features)")
    p.add_argument("--num-features", type=positive_int, default=4, help="feature layers of the default rule")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    p.set_defaults(func=run_cli)


def feature_error(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """The error of ``other`` against ``reference``, both [tokens, hidden], in float32."""
    reference, other = reference.float(), other.float()
    rel = (other - reference).norm() / reference.norm().clamp_min(1e-30)
    cosine = torch.nn.functional.cosine_similarity(reference, other, dim=-1)
    return {"rel_error": round(float(rel), 6), "cosine_mean": round(float(cosine.mean()), 6),
            "cosine_p01": round(float(torch.quantile(cosine, 0.01)), 6), "tokens": reference.shape[0]}


def _texts(args, tokenizer) -> list[str]:
    """Rendered conversations: ``--data``'s records, else the held-out prompts (with the generation prompt)."""
    from dflash_train.data.tokenize import render

    if not args.data:
        from dflash_train.data.prompt_sets import resolve_prompts
        from dflash_train.data.prompts import read_prompts

        prompts = read_prompts(resolve_prompts("heldout"), limit=args.rows)
        return [render(tokenizer, p, add_generation_prompt=True) for p in prompts]
    from dflash_train.data.errors import SkipReport
    from dflash_train.data.readers import read_records

    texts = []
    for record in read_records(args.data, SkipReport()):
        texts.append(record.text if record.messages is None else render(tokenizer, record.messages))
        if len(texts) == args.rows:
            break
    return texts


def _features(target, rows: list[torch.Tensor], layer_ids: list[int]) -> list[torch.Tensor]:
    """Per layer, every row's features stacked to [tokens, hidden] (one row at a time: no padding)."""
    per_row = [target.features(ids[None], None, layer_ids)[0] for ids in rows]
    hidden = target.facts.hidden_size
    return [torch.cat([f[:, i * hidden:(i + 1) * hidden] for f in per_row]) for i in range(len(layer_ids))]


def run_cli(args) -> int:
    from dflash_train.bench.cli import write_result
    from dflash_train.devices import resolve_device
    from dflash_train.models.config import default_target_layer_ids
    from dflash_train.models.fp8 import native_fp8
    from dflash_train.models.target import Target

    device = resolve_device(args.device, "--device")
    target = Target.load(args.target, dtype=torch.bfloat16, device=device)
    layer_ids = args.layer_ids or default_target_layer_ids(target.facts.num_hidden_layers, args.num_features)
    target.validate_layer_ids(layer_ids)
    texts = _texts(args, target.tokenizer)
    rows = [torch.tensor(target.tokenizer(t, add_special_tokens=False)["input_ids"][: args.max_length],
                         device=device) for t in texts]
    start = time.perf_counter()
    bf16 = _features(target, rows, layer_ids)
    fp8_target = copy.deepcopy(target)
    emulate = not native_fp8(device)
    fp8_target.use_fp8_linears(emulate=emulate)
    fp8 = _features(fp8_target, rows, layer_ids)
    result = {
        "target": str(args.target), "device": str(device), "fp8": "emulated" if emulate else "native",
        "rows": len(rows), "tokens": sum(len(r) for r in rows), "text": "data" if args.data else "heldout",
        "layers": {str(i): feature_error(a, b) for i, a, b in zip(layer_ids, bf16, fp8)},
        "seconds": round(time.perf_counter() - start, 1),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        write_result(text, Path(args.out))
    return 0
