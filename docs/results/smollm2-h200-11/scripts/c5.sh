#!/bin/bash
# call 5 (after call 4, on the same machine): the composed answers ALONE, 1.1 minutes of steps with the ninth
# run's main recipe (train.loss_positions=8 train.reach_weighting=true), replayed on the 40 held-out prompts,
# compared with the ninth run's `reach` ablation. NOT equal steps: 43.4K conversations are 1,414 steps an
# epoch, cached after the first, so 1.1 minutes hold 4,219 steps (2,655 for `reach`); call 6 is the
# equal-steps run. (As run, the first try stopped at once on an unset variable after moving the first two
# sets aside; this is the second.)
set -u
source .gpu/s/env.sh
mkdir -p $D/off2; mv $D/greedy-0.jsonl $D/greedy-1.jsonl $D/off2/ 2>/dev/null
d=$K/abl/conly; mkdir -p $d
EXTRA="train.feature_cache_gib=124"; set_common
trap "(cd \$K && tar czf \$OUT/c5.tgz --ignore-failed-read abl/conly/train.log abl/conly/eval.json abl/conly/replay.log abl/conly/metrics.jsonl abl/conly/summary.json abl/conly/compare.txt 2>/dev/null)" EXIT
timeout 200 $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=1.1 train.log_every=50 \
  train.save_every_minutes=0 train.loss_positions=8 train.reach_weighting=true > $d/train.log 2>&1
cp $d/run/summary.json $d/run/metrics.jsonl $d/
grep -E "kept|steps/epoch|spent" $d/train.log
REPLAY_ARGS=--batched timeout 100 bash .gpu/s/replayrun.sh $d/run $d
$PY -m dflash_train.eval.compare docs/results/smollm2-h200-10/abl/reach/eval.json $d/eval.json \
  --prompts 1-24 --prompts 25-40 --prompts 1-40 | tee $d/compare.txt
