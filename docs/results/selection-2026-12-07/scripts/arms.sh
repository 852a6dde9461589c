#!/usr/bin/env bash
# calls 3-5 (the whole tree): the answer sets unpacked into $K/data once, then the arms named in $ARMS through the
# user's command, src/dflash_train/recipes/smollm2/kinds.sh (ABL_MIN minutes of steps each, exported, replayed on
# the 96 selection prompts, compared with the recipe), one arm at a time while the call has time for a whole arm
source docs/results/selection-2026-12-07/scripts/env.sh
if [ ! -s $K/data/greedy-2.jsonl ]; then
  STAGES=data DATA=$K/data PY=python3 bash src/dflash_train/recipes/smollm2/reproduce.sh | tail -5
  stage data
fi
ARM_SECONDS=${ARM_SECONDS:-170}  # one arm: start, data cache, compile, 1.1 min of steps, export, replay
for arm in $ARMS; do
  if [ -s $K/kinds/$arm/eval.json ]; then echo "== $arm: done before"; continue; fi
  if [ "$(left)" -lt "$ARM_SECONDS" ]; then echo "== $arm: not started, $(left) s left in this call"; continue; fi
  ARMS=$arm OUT=$K/kinds DATA=$K/data DFT="$DFT" EXTRA="data.cache_dir=$K/cache" \
    timeout $(( $(left) - 10 )) bash src/dflash_train/recipes/smollm2/kinds.sh 2>&1 | grep -v "^  *[a-z]" | tail -8
  mkdir -p $RES/kinds/$arm
  (cd $K/kinds/$arm && cp -f overrides.txt train.log export.log replay.log eval.json run/summary.json run/metrics.jsonl $RES/kinds/$arm/ 2>/dev/null)
  cp -f $K/kinds/compare.* $K/kinds/refs-selection.json $RES/kinds/ 2>/dev/null
  stage "arm $arm"
done
