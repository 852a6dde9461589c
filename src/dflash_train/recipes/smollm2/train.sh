#!/usr/bin/env bash
# Stages 3-5: train (B=16), export, held-out eval. Training must fit one <= 10 minute command:
# cap it with MAX_STEPS (or EPOCHS) and run export+eval as a separate command if needed (STAGES).
# Usage: bash src/dflash_train/recipes/smollm2/train.sh        (STAGES="train export eval")
set -euo pipefail
TARGET=${TARGET:-assets/smollm2}
DATA=${DATA:-runs/smollm2/data}
RUN=${RUN:-runs/smollm2/run}
EXPORT=${EXPORT:-runs/smollm2/drafter}
EPOCHS=${EPOCHS:-3}
MAX_STEPS=${MAX_STEPS:-null}        # e.g. 3000 to bound wall time
STAGES=${STAGES:-"train export eval"}
DFT=${DFT:-dflash-train}
HELDOUT=$(python -c "from dflash_train.recipes.offline_data import heldout_prompts_path as p; print(p())")
stage() { echo "== $1: $(( $(date +%s) - T0 ))s"; }
T0=$(date +%s)
PATHS="$DATA/greedy.jsonl"
[ -s "$DATA/sampled.jsonl" ] && PATHS="$PATHS,$DATA/sampled.jsonl"

if [[ " $STAGES " == *" train "* ]]; then
  $DFT train smollm2-1gpu "data.paths=[$PATHS]" "train.run_dir=$RUN" "train.epochs=$EPOCHS" \
    "train.max_steps=$MAX_STEPS" "drafter.block_size=16" "$@"
  stage "train done"
fi
if [[ " $STAGES " == *" export "* ]]; then
  $DFT export "$RUN" "$EXPORT" --target "$TARGET" --force
  stage "export done"
fi
if [[ " $STAGES " == *" eval "* ]]; then
  $DFT eval --target "$TARGET" --drafter "$EXPORT" --prompts "$HELDOUT" --block-size 16 --out "$RUN/eval"
  stage "eval done"
fi
