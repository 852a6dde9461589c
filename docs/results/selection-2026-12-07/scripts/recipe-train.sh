#!/usr/bin/env bash
# call 3 (the whole tree): the answer sets unpacked into $K/data, then the recipe as reproduce.sh runs it (the
# user's command), MIN minutes of steps (the call's 10 minutes hold the data, the tokenizing and the compile too),
# exported in float32
source docs/results/selection-2026-12-07/scripts/env.sh
MIN=${MIN:-3.5}
R=$K/recipe; mkdir -p $R $RES/recipe
export DATA=$K/data RUN=$R/run EXPORT=$R/drafter DFT PY=python3
STAGES="data train export" bash src/dflash_train/recipes/smollm2/reproduce.sh data.cache_dir=$K/cache \
  train.time_budget_minutes=$MIN train.save_every_minutes=0 > $R/train.log 2>&1
echo "reproduce.sh rc=$?"; grep -E "^== |error|spent at step|feature cache" $R/train.log | tail -12
cp -f $R/train.log $R/run/summary.json $R/run/metrics.jsonl $R/run/config.json $RES/recipe/ 2>/dev/null
stage "recipe train+export ($MIN min)"
