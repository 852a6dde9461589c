#!/bin/bash
# call 3: (1) the feature cache on the GPU: 3,000 conversations, many epochs in ~25 s, steps served
# from the cache counted; (2) the ablations at EQUAL GPU TIME: each variant of variants.txt trains
# alone on the GPU for BUDGET minutes of steps (the LR schedule completes inside the budget; the
# first, compiling step is not charged), then is replayed (batched) on the 40 held-out prompts while
# the next one trains.
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c3.tgz --ignore-failed-read runs/*/train.log runs/*/eval.json runs/*/replay.log runs/*/summary.json runs/*/metrics.jsonl runs/*/export.log runs/compare.md fc/train.log fc/run/summary.json fc/run/metrics.jsonl 2>/dev/null)' EXIT
BUDGET=${BUDGET:-0.7}
mkdir -p $K/runs $K/fc
env $(gpu 0) timeout 100 $DFT train $COMMON train.run_dir=$K/fc/run data.max_examples=3000 train.feature_cache=device \
  train.time_budget_minutes=0.4 train.log_every=10 > $K/fc/train.log 2>&1 && grep -q '"hits"' $K/fc/run/summary.json && touch $K/fc_ok
grep -E "feature cache|steps/epoch|first step" $K/fc/train.log; $PY -c "import json; print(json.load(open('$K/fc/run/summary.json')).get('feature_cache'))"
stage "feature cache checked: $([ -f $K/fc_ok ] && echo ok || echo FAILED)"
while IFS='|' read -r name ov; do
  [ $(left) -lt $(( ${BUDGET%.*} * 60 + 75 )) ] && { echo "no time for $name"; break; }
  d=$K/runs/$name; mkdir -p $d
  env $(gpu 0) timeout --signal=TERM $(( $(left) - 40 )) $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=$BUDGET \
    train.log_every=25 $ov > $d/train.log 2>&1
  cp $d/run/metrics.jsonl $d/run/summary.json $d/ 2>/dev/null
  stage "trained $name: $(grep -o '"steps": [0-9]*' $d/summary.json)"
  REPLAY_ARGS=--batched timeout $(( $(left) - 10 )) bash .gpu/s/replayrun.sh $d/run $d &
done < ${VARIANTS:-.gpu/s/variants.txt}
wait
stage "ablations trained and replayed"
for n in $(cut -d"|" -f1 ${VARIANTS:-.gpu/s/variants.txt}); do echo "$n $(grep -o '"steps": [0-9]*' $K/runs/$n/summary.json 2>/dev/null) $(grep -o 'mean tau [0-9.]*' $K/runs/$n/replay.log 2>/dev/null)"; done | tee $OUT/taus.txt
V=$(for n in $(cut -d"|" -f1 ${VARIANTS:-.gpu/s/variants.txt} | tail -n +2); do [ -s $K/runs/$n/eval.json ] && echo $K/runs/$n/eval.json; done)
$PY -m dflash_train.eval.compare $K/runs/base/eval.json $V --prompts 1-24 --prompts 25-40 --prompts 1-40 --json $K/runs/compare.json | tee $K/runs/compare.md
