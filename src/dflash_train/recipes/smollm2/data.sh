#!/usr/bin/env bash
# Stages 1+2 of the SmolLM2-135M recipe: prompts, then the target's own greedy answers.
#   (1) prompts: ~2.4K offline seeds + NUM_SYNTH prompts written by the target (static backend)
#   (2) responses: greedy regeneration of every prompt, split over NGPU GPUs (one process each)
# Usage: NGPU=1 NUM_SYNTH=100000 bash src/dflash_train/recipes/smollm2/data.sh
# Measured on one H200 (README "SmolLM2 results"): 100,000 synthetic prompts in 121 s (42.9K tok/s);
# greedy regeneration 61.0K new tokens/s on one H200 at <= 256 tokens (cudagraph decode, grouped attention,
# 2048 rows): 68,916 answers in 174 s (README "second run").
set -euo pipefail
NUM_SYNTH=${NUM_SYNTH:-70000}
NGPU=${NGPU:-1}
TARGET=${TARGET:-assets/smollm2}
OUT=${OUT:-runs/smollm2/data}
MAX_NEW=${MAX_NEW:-256}              # response length cap (tokens): 61.0K new tok/s at 256, 48.4K at 320
GEN_BATCH=${GEN_BATCH:-2048}         # rows per decode bucket
SYNTH_SECONDS=${SYNTH_SECONDS:-110}  # wall cap for prompt writing (what is done is kept)
REGEN_SECONDS=${REGEN_SECONDS:-330}  # wall cap per regeneration pass (resumable: rerun to continue)
DFT=${DFT:-dflash-train}
DEVICE=${DEVICE:-cuda}
# More data beside an existing set (its answers in greedy-*.jsonl of another folder): another SEED writes
# other prompts, EXCLUDE (chat files) drops any prompt already there, SEED_PROMPTS=0 skips the offline
# seeds (the first set has them). E.g. OUT=runs/smollm2/data2 SEED=1 SEED_PROMPTS=0 \
#   EXCLUDE="runs/smollm2/data/greedy-0.jsonl" bash src/dflash_train/recipes/smollm2/data.sh
SEED=${SEED:-0}
SEED_PROMPTS=${SEED_PROMPTS:-1}
# NUM_COMPOSED=N: N prompts composed from request templates (data/builders/composed_prompts.py: explain, advise,
# compare, create, rewrite, code, calculate, plan ...) beside the target-written ones; NUM_SYNTH=0 for those alone
NUM_COMPOSED=${NUM_COMPOSED:-0}
EXCLUDE=${EXCLUDE:-}
# COMPACT=1: regenerate --compact (a bucket's running rows continue at a smaller batch once half have
# finished: the same answers; not yet timed on a GPU)
COMPACT=${COMPACT:-0}
mkdir -p "$OUT"
stage() { echo "== $1: $(( $(date +%s) - T0 ))s"; }
T0=$(date +%s)

if [ "$SEED_PROMPTS" = 1 ]; then
  [ -s "$OUT/seeds.jsonl" ] || $DFT prompts --out "$OUT/seeds.jsonl" --seed "$SEED" \
    ${EXCLUDE:+--exclude $EXCLUDE}
else
  : > "$OUT/seeds.jsonl"
fi
if [ ! -s "$OUT/synth.jsonl" ]; then
  $DFT prompts --target "$TARGET" --out "$OUT/synth.jsonl" --no-seeds --seed "$SEED" \
    ${EXCLUDE:+--exclude $EXCLUDE} --num-synthetic "$NUM_SYNTH" --num-composed "$NUM_COMPOSED" \
    --batch-size "$GEN_BATCH" --backend static \
    --device "$DEVICE" --max-seconds "$SYNTH_SECONDS"
fi
stage "prompts done ($(wc -l < "$OUT/seeds.jsonl") seeds, $(wc -l < "$OUT/synth.jsonl") synthetic)"

# one shard of all prompts per GPU; --batch-size is records per written chunk (a cut pass keeps
# every finished chunk and a rerun resumes after it)
cat "$OUT/seeds.jsonl" "$OUT/synth.jsonl" | awk -v n="$NGPU" -v d="$OUT" '{print > (d "/shard-" (NR % n) ".jsonl")}'
for g in $(seq 0 $((NGPU - 1))); do
  CUDA_VISIBLE_DEVICES=$g timeout --signal=INT "$REGEN_SECONDS" $DFT regenerate --target "$TARGET" \
    --data "$OUT/shard-$g.jsonl" --out "$OUT/greedy-$g.jsonl" --backend static --max-new-tokens "$MAX_NEW" \
    --batch-size 2048 --max-batch "$GEN_BATCH" --device "$DEVICE" $([ "$COMPACT" = 1 ] && echo --compact) \
    > "$OUT/regen-$g.log" 2>&1 &
done
wait || true
stage "greedy done ($(cat "$OUT"/greedy-*.jsonl | wc -l) responses)"
