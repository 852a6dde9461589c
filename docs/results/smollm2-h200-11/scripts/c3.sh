#!/bin/bash
# call 3: the main run alone on the GPU, MAIN_MIN minutes of steps, the ninth run's main recipe
# (train.loss_positions=8 train.reach_weighting=true) + train.feature_cache_gib=124, on what call 2 chose
# ($K/choice.txt): `comp` = all three answer sets, `g25` = the first two with train.gamma=2.5.
# GPU memory sampled every 5 s. Its evaluation is call 4.
set -u
source .gpu/s/env.sh
CHOICE=${CHOICE:-$(tail -1 $K/choice.txt 2>/dev/null)}
G=""; if [ "$CHOICE" = g25 ]; then mkdir -p $D/off; mv $D/greedy-2.jsonl $D/off/ 2>/dev/null; G="train.gamma=2.5"; fi
EXTRA="train.feature_cache_gib=124 train.loss_positions=8 train.reach_weighting=true $G"
set_common
echo "choice: $CHOICE; $DATA_PATHS $EXTRA"
MAIN_MIN=${MAIN_MIN:-8}
mkdir -p $K/main
trap 'cp $K/main/run/metrics.jsonl $K/main/run/summary.json $K/main/ 2>/dev/null; (cd $K && tar czf $OUT/c3.tgz --ignore-failed-read main/train.log main/metrics.jsonl main/summary.json main/cmd.txt main/gpumem.log 2>/dev/null)' EXIT
( while true; do nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader | ts; sleep 5; done ) > $K/main/gpumem.log 2>&1 &
echo "$DFT train $COMMON train.run_dir=RUN train.time_budget_minutes=$MAIN_MIN train.log_every=100" | tee $K/main/cmd.txt
timeout --signal=TERM $(( $(left) - 12 )) $DFT train $COMMON train.run_dir=$K/main/run train.time_budget_minutes=$MAIN_MIN \
  train.log_every=100 2>&1 | ts > $K/main/train.log
stage "main run done"
grep -E "first step|feature cache|steps/epoch|time budget|kept" $K/main/train.log | head; tail -3 $K/main/train.log
echo "peak GPU memory used: $(awk '{print $2}' $K/main/gpumem.log | sort -n | tail -1) MiB"
