#!/bin/bash
# call 2b (as run, right after call 2 on the same machine): call 2's ablation again, now with
# train.feature_cache_gib=124, its replay, the comparison with the ninth run's `reach` ablation and the rule's
# choice (call 2 had chosen g25 on the failed ablation and set the composed answers aside; moved back first)
set -u
source .gpu/s/env.sh
mv $K/data/off/greedy-2.jsonl $K/data/
A=$K/abl
trap "(cd \$K && tar czf \$OUT/c2b.tgz --ignore-failed-read choice.txt warm2.log abl/*/train.log abl/*/eval.json abl/*/summary.json abl/*/metrics.jsonl abl/*/replay.log abl/compare.json abl/compare.txt 2>/dev/null)" EXIT
rm -rf $A/comp
EXTRA="train.feature_cache_gib=124"; set_common
n=comp; d=$A/$n; mkdir -p $d
echo "train.loss_positions=8 train.reach_weighting=true (3 sets)" > $d/overrides.txt
timeout $(( $(left) - 70 )) $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=1.1 \
  train.log_every=50 train.save_every_minutes=0 train.loss_positions=8 train.reach_weighting=true > $d/train.log 2>&1
cp $d/run/summary.json $d/run/metrics.jsonl $d/ 2>/dev/null
stage "ablation $n: $(grep -o 'spent at step [0-9]*' $d/train.log | tail -1)"
REPLAY_ARGS=--batched timeout $(( $(left) - 10 )) bash .gpu/s/replayrun.sh $d/run $d
B=docs/results/smollm2-h200-10/abl/reach/eval.json
$PY -m dflash_train.eval.compare $B $d/eval.json --prompts 1-24 --prompts 25-40 --prompts 1-40 \
  --choose 25-40 --min-se 0 --skip-missing --json $A/compare.json > $A/compare.txt 2>&1; cat $A/compare.txt
if grep -q "^choice: .*comp" $A/compare.txt; then echo "comp" > $K/choice.txt; else echo "g25" > $K/choice.txt; fi
cat $K/choice.txt
stage "replay and choice"
