#!/usr/bin/env bash
# The drafter kinds and objectives at equal GPU time on the SmolLM2 recipe, one H200: a choice made on the
# `selection` prompts, never on the ones results are reported on. Each arm trains ABL_MIN minutes of steps
# (default 1.1, the recipe's ablation length) on the three committed answer sets (features cached on the GPU, as much as the card holds;
# decontaminated: records asking an evaluation prompt are dropped), is exported in float32 and replayed (exact
# greedy tau, no verify steps) on the 96 `selection` prompts; `dflash-train compare` then pairs every arm with
# the recipe as it is (dflash, CE weighted by reach) per prompt and names the arm whose gain is above 2
# standard errors (`choice:`). Report the chosen arm on `heldout` afterwards (`dflash-train eval`). Steps per
# arm (from each summary.json) give the step-time cost of each kind.
#
# Usage (from the repository root, after `make venv`; ~2.5 minutes an arm on one H200; rerun to finish the arms
# not yet replayed, e.g. after a time limit):
#   STAGES=data bash src/dflash_train/recipes/smollm2/reproduce.sh   # the answer sets, once
#   bash src/dflash_train/recipes/smollm2/kinds.sh                   # ARMS="dflash2 dflash ..." for a subset
#   OUT=runs/smollm2/kinds DATA=runs/smollm2/data TARGET=assets/smollm2 ABL_MIN=1.1 DFT=dflash-train LIMIT=96
#   EXTRA="k=v ..." more training overrides for every arm (a CPU dry run: EXTRA="train.device=cpu ...")
# Arms: dflash (the recipe: CE weighted by reach), dflash-decay (the paper's decay alone), dflash-dpace, dflash-kl
# (forward KL to the target's distribution), dflash-tv (0.1 CE + 0.9 total variation); dflash2, dflash2-dpace (the selector's loss excluding rows whose label
# is not among the candidates, as first measured), dflash2-inject and dflash2-dpace-inject (the label injected:
# the default), dflash2-seed1 (another seed: how far two trainings of one arm differ); dspark, dspark-dpace,
# dspark-tv (DSpark's published mix, 0.1 CE + 0.9 total variation to the target); dflash-fp8target (the
# recipe on an FP8 target's features, target.fp8_linear, replayed with the float32 target like every arm).
# The kl and tv arms read the target's whole distribution at every step, so they train without the feature cache
# (their steps include the target's forward: fewer steps in the same minutes, as a user would get).
set -uo pipefail
TARGET=${TARGET:-assets/smollm2}
DATA=${DATA:-runs/smollm2/data}
OUT=${OUT:-runs/smollm2/kinds}
ABL_MIN=${ABL_MIN:-1.1}
DFT=${DFT:-dflash-train}
ARMS=${ARMS:-"dflash dflash-decay dflash-dpace dflash-kl dflash-tv dflash2-dpace-inject dspark dspark-tv"}
EXTRA=${EXTRA:-}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
T0=$(date +%s)
stage() { echo "== $1: $(( $(date +%s) - T0 ))s"; }
PATHS="data.paths=[$DATA/greedy-0.jsonl,$DATA/greedy-1.jsonl,$DATA/greedy-2.jsonl]"
[ -s "$DATA/greedy-2.jsonl" ] || { echo "no $DATA/greedy-2.jsonl: run STAGES=data bash src/dflash_train/recipes/smollm2/reproduce.sh"; exit 1; }

overrides() {
  case $1 in
    dflash) echo "" ;;
    dflash-decay) echo "objective.weighting=decay" ;;
    dflash-dpace) echo "objective.weighting=dpace" ;;
    dflash-kl) echo 'objective.targets={"kl":1.0} train.feature_cache=off' ;;
    dflash-tv) echo 'objective.targets={"ce":0.1,"tv":0.9} train.feature_cache=off' ;;
    dflash2) echo "drafter.kind=dflash2 objective.kind.selector_out_of_topk=exclude" ;;
    dflash2-dpace) echo "drafter.kind=dflash2 objective.weighting=dpace objective.kind.selector_out_of_topk=exclude" ;;
    dflash2-inject) echo "drafter.kind=dflash2 objective.kind.selector_out_of_topk=inject" ;;
    dflash2-dpace-inject) echo "drafter.kind=dflash2 objective.weighting=dpace objective.kind.selector_out_of_topk=inject" ;;
    dflash2-seed1) echo "drafter.kind=dflash2 objective.kind.selector_out_of_topk=exclude train.seed=1" ;;
    dflash-fp8target) echo "target.fp8_linear=true" ;;
    dspark) echo "drafter.kind=dspark" ;;
    dspark-dpace) echo "drafter.kind=dspark objective.weighting=dpace" ;;
    dspark-tv) echo 'drafter.kind=dspark objective.targets={"ce":0.1,"tv":0.9} train.feature_cache=off' ;;
    *) echo "unknown arm $1" >&2; return 1 ;;
  esac
}

for arm in $ARMS; do
  over=$(overrides "$arm") || exit 1
  d=$OUT/$arm
  if [ -s "$d/eval.json" ]; then echo "== $arm: replayed before ($d/eval.json), kept"; continue; fi
  rm -rf "$d" && mkdir -p "$d"  # an arm cut short starts again (arms are short)
  echo "$over" > "$d/overrides.txt"
  # shellcheck disable=SC2086  # the overrides are separate words
  $DFT train smollm2-1gpu "$PATHS" "target.path=$TARGET" eval.prompts=null train.progress=false \
    train.run_dir="$d/run" train.time_budget_minutes="$ABL_MIN" train.log_every=200 train.save_every_minutes=0 \
    $over $EXTRA > "$d/train.log" 2>&1 || { echo "train $arm failed: $d/train.log"; continue; }
  stage "train $arm: $(grep -o 'spent at step [0-9]*' "$d/train.log" | tail -1)"
  $DFT export "$d/run" "$d/drafter" --target "$TARGET" --force --dtype float32 > "$d/export.log" 2>&1 &&
  $DFT replay --target "$TARGET" --drafter "$d/drafter" --prompts selection --limit "${LIMIT:-96}" --max-new-tokens 128 \
    --dtype float32 --references "$OUT/refs-selection.json" --batched --out "$d" > "$d/replay.log" 2>&1
  stage "replay $arm: $(grep -o 'mean tau [0-9.]*' "$d/replay.log")"
done
variants=()
for arm in $ARMS; do [ "$arm" = dflash ] || variants+=("$OUT/$arm"); done
$DFT compare "$OUT/dflash" "${variants[@]}" --prompts "1-${LIMIT:-96}" --choose "1-${LIMIT:-96}" --min-se 2 \
  --skip-missing --json "$OUT/compare.json" | tee "$OUT/compare.txt"
stage "compare: $OUT/compare.txt"
