#!/usr/bin/env bash
# Stages 1+2 of the SmolLM2-135M recipe on one GPU, sized to finish in one <= 10 minute command.
#   (1) prompts: offline seeds + NUM_SYNTH prompts written by the target (fast static backend)
#   (2) responses: greedy regeneration of every prompt + a sampled (T=0.7) variant of a fraction
# Usage: bash src/dflash_train/recipes/smollm2/data.sh [NUM_SYNTH]   (env knobs below)
set -euo pipefail
NUM_SYNTH=${1:-${NUM_SYNTH:-30000}}
TARGET=${TARGET:-assets/smollm2}
OUT=${OUT:-runs/smollm2/data}
MAX_NEW=${MAX_NEW:-320}             # response length cap (tokens)
GEN_BATCH=${GEN_BATCH:-1024}        # rows per decode bucket
SAMPLED_FRACTION=${SAMPLED_FRACTION:-0.25}
REGEN_SECONDS=${REGEN_SECONDS:-330} # wall cap for the greedy pass (resumable: rerun to continue)
SAMPLED_SECONDS=${SAMPLED_SECONDS:-90}
GEN_MODE=${GEN_MODE:-auto}          # auto (cudagraph on CUDA) | compile | eager
PY=${PY:-python}
DFT=${DFT:-dflash-train}
mkdir -p "$OUT"
stage() { echo "== $1: $(( $(date +%s) - T0 ))s"; }
T0=$(date +%s)

if [ ! -s "$OUT/prompts.jsonl" ]; then
  $PY -m dflash_train.recipes.prompts --target "$TARGET" --out "$OUT/prompts.jsonl" \
    --num-synthetic "$NUM_SYNTH" --batch-size "$GEN_BATCH" --backend static --device cuda
fi
stage "prompts done ($(wc -l < "$OUT/prompts.jsonl") prompts)"

# greedy responses; timeout keeps the stage inside the command limit (partial output is valid, resumable)
timeout --signal=INT "$REGEN_SECONDS" $DFT regenerate --target "$TARGET" --data "$OUT/prompts.jsonl" \
  --out "$OUT/greedy.jsonl" --backend static --gen-mode "$GEN_MODE" --max-new-tokens "$MAX_NEW" \
  --batch-size 8192 --max-batch "$GEN_BATCH" --device cuda || echo "greedy pass stopped early (rc=$?)"
stage "greedy done ($(wc -l < "$OUT/greedy.jsonl") records)"

# a sampled variant for a fraction of the prompts, with distinct ids
$PY - "$OUT/prompts.jsonl" "$OUT/sampled_prompts.jsonl" "$SAMPLED_FRACTION" <<'PYEOF'
import json, random, sys
src, dst, frac = sys.argv[1], sys.argv[2], float(sys.argv[3])
rng = random.Random(1)
with open(src) as f, open(dst, "w") as g:
    for line in f:
        if rng.random() < frac:
            rec = json.loads(line)
            rec["id"] = rec["id"] + "-t07"
            g.write(json.dumps(rec, ensure_ascii=False) + "\n")
PYEOF
timeout --signal=INT "$SAMPLED_SECONDS" $DFT regenerate --target "$TARGET" --data "$OUT/sampled_prompts.jsonl" \
  --out "$OUT/sampled.jsonl" --backend static --gen-mode "$GEN_MODE" --max-new-tokens "$MAX_NEW" \
  --temperature 0.7 --top-p 0.95 --batch-size 8192 --max-batch "$GEN_BATCH" --device cuda --seed 1 \
  || echo "sampled pass stopped early (rc=$?)"
stage "sampled done ($(wc -l < "$OUT/sampled.jsonl" 2>/dev/null || echo 0) records)"
