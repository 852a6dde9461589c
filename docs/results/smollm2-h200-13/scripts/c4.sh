#!/bin/bash
# call 4: the main run alone on the GPU, MAIN_MIN minutes of steps: the recipe (the eleventh run's main run: all
# three answer sets, Muon lr 2.4e-3, loss_positions 8, reach weighting, train.feature_cache_gib=124) with the
# change call 3 chose ($K/choice.txt: lr48 = optim.lr=4.8e-3, b32 = data.token_budget=16384, recipe = none).
# GPU memory sampled every 5 s. Its evaluation is call 5.
set -u
source .gpu/s/env.sh
CHOICE=${CHOICE:-$(tail -1 $K/choice.txt 2>/dev/null)}
case "$CHOICE" in lr48) O="optim.lr=4.8e-3";; b32) O="data.token_budget=16384";; *) O="";; esac
EXTRA="train.feature_cache_gib=124 $O"
set_common
echo "choice: $CHOICE; $DATA_PATHS $EXTRA"
MAIN_MIN=${MAIN_MIN:-8}
mkdir -p $K/main
trap 'cp $K/main/run/metrics.jsonl $K/main/run/summary.json $K/main/ 2>/dev/null; (cd $K && tar czf $OUT/c4.tgz --ignore-failed-read main/train.log main/metrics.jsonl main/summary.json main/cmd.txt main/gpumem.log 2>/dev/null)' EXIT
( while true; do nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader | ts; sleep 5; done ) > $K/main/gpumem.log 2>&1 &
echo "$DFT train $COMMON train.run_dir=RUN train.time_budget_minutes=$MAIN_MIN train.log_every=100" | tee $K/main/cmd.txt
timeout --signal=TERM $(( $(left) - 12 )) $DFT train $COMMON train.run_dir=$K/main/run train.time_budget_minutes=$MAIN_MIN \
  train.log_every=100 2>&1 | ts > $K/main/train.log
stage "main run done"
grep -E "first step|feature cache|steps/epoch|time budget|kept|capture" $K/main/train.log | head; tail -3 $K/main/train.log
echo "peak GPU memory used: $(awk '{print $2}' $K/main/gpumem.log | sort -n | tail -1) MiB"
