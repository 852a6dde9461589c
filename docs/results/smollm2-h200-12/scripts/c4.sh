#!/bin/bash
# call 4: the main run alone on the GPU, MAIN_MIN minutes of steps, the tenth run's main run (all three answer
# sets, train.loss_positions=8 train.reach_weighting=true, train.feature_cache_gib=124) with the optimizer call 3
# chose ($K/choice.txt: muon = optim.name=muon, muon4 = the same with optim.lr=2.4e-3, adamw = the tenth run's).
# GPU memory sampled every 5 s. Its evaluation is call 5.
# Since this run the recipe itself holds Muon (lr 2.4e-3): AdamW as run here now needs optim.name=adamw optim.lr=6e-4.
set -u
source .gpu/s/env.sh
CHOICE=${CHOICE:-$(tail -1 $K/choice.txt 2>/dev/null)}
case "$CHOICE" in muon) O="optim.name=muon";; muon4) O="optim.name=muon optim.lr=2.4e-3";; *) O="";; esac
EXTRA="train.feature_cache_gib=124 train.loss_positions=8 train.reach_weighting=true $O"
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
