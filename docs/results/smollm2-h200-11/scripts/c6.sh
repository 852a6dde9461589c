#!/bin/bash
# call 6 (after call 5, on the same machine): the composed answers alone at EQUAL STEPS with the ninth run's
# `reach` ablation: train.max_steps=2655 (its step count in 1.1 minutes; the schedule completes there), no
# time budget; replayed and compared as in call 5
set -u
source .gpu/s/env.sh
d=$K/abl/conly-s; mkdir -p $d
EXTRA="train.feature_cache_gib=124"; set_common
trap "(cd \$K && tar czf \$OUT/c6.tgz --ignore-failed-read abl/conly-s/train.log abl/conly-s/eval.json abl/conly-s/replay.log abl/conly-s/metrics.jsonl abl/conly-s/summary.json abl/conly-s/compare.txt 2>/dev/null)" EXIT
timeout 150 $DFT train $COMMON train.run_dir=$d/run train.max_steps=2655 train.time_budget_minutes=0 train.log_every=50 \
  train.save_every_minutes=0 train.loss_positions=8 train.reach_weighting=true > $d/train.log 2>&1
cp $d/run/summary.json $d/run/metrics.jsonl $d/
grep -E "kept|steps/epoch|spent|step 2655" $d/train.log | tail -3
REPLAY_ARGS=--batched timeout 70 bash .gpu/s/replayrun.sh $d/run $d
$PY -m dflash_train.eval.compare docs/results/smollm2-h200-10/abl/reach/eval.json $d/eval.json \
  --prompts 1-24 --prompts 25-40 --prompts 1-40 | tee $d/compare.txt
