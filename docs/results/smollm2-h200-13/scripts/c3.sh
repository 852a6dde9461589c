#!/bin/bash
# call 3 (carry .gpu/s .whl; the tree without sets 1 and 3, which calls 1-2 kept): the three answer sets,
# tokenized (warm run of 3 steps); TWO ablations of the recipe (Muon, lr 2.4e-3, loss_positions 8, reach
# weighting) at the eleventh run's ablation length (1.1 minutes of steps, all three sets, features 124 GiB on
# the GPU): twice the learning rate (`lr48`: optim.lr=4.8e-3) and twice the rows per step (`b32`:
# data.token_budget=16384, 32 rows of 512, half the steps); each replayed (batched) on the 40 held-out prompts and
# compared with the eleventh run's `muon4` ablation (the recipe as it is, same data and length). The main run's
# recipe by a rule fixed here, before the runs: the variant with the larger paired gain on prompts 25-40 if
# positive (eval.compare --choose 25-40 --min-se 0), else the recipe.
set -u
source .gpu/s/env.sh
A=$K/abl
mkdir -p $A $D/.s
trap '(cd $K && tar czf $OUT/c3.tgz --ignore-failed-read warm.log choice.txt abl/*/train.log abl/*/eval.json abl/*/summary.json abl/*/metrics.jsonl abl/*/replay.log abl/*/overrides.txt abl/compare.json abl/compare.txt 2>/dev/null)' EXIT
ln -sfn $K/smollm2 assets/smollm2
tar xJf $K/greedy-answers.tar.xz -C $D
tar xJf docs/results/smollm2-h200-8/data/greedy-answers-2.tar.xz -C $D/.s && mv $D/.s/greedy-0.jsonl $D/greedy-1.jsonl
tar xJf $K/greedy-answers-3.tar.xz -C $D/.s && mv $D/.s/greedy-0.jsonl $D/greedy-2.jsonl
wc -l $D/greedy-*.jsonl
EXTRA="train.feature_cache_gib=124"; set_common
timeout $(( $(left) - 8 )) $DFT train $COMMON train.run_dir=$K/warm train.max_steps=3 train.time_budget_minutes=0 \
  > $K/warm.log 2>&1
grep -h -i "read\|trim\|kept\|steps/epoch\|feature cache\|first step\|too_few" $K/warm.log | head -10
stage "tokenized, recipe compiled"
ABL_MIN=${ABL_MIN:-1.1}
for spec in "lr48:optim.lr=4.8e-3" "b32:data.token_budget=16384"; do
  n=${spec%%:*}; over=${spec#*:}; d=$A/$n; mkdir -p $d
  echo "$over (the recipe otherwise; 3 sets)" > $d/overrides.txt
  [ $(left) -gt 150 ] || { echo "no time for $n"; break; }
  timeout $(( $(left) - 60 )) $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=$ABL_MIN \
    train.log_every=50 train.save_every_minutes=0 $over > $d/train.log 2>&1
  cp $d/run/summary.json $d/run/metrics.jsonl $d/ 2>/dev/null
  grep -h -i "warn\|capture\|error" $d/train.log | head -3
  stage "ablation $n: $(grep -o 'spent at step [0-9]*' $d/train.log | tail -1)"
  REPLAY_ARGS=--batched timeout $(( $(left) - 10 )) bash .gpu/s/replayrun.sh $d/run $d
done
B=docs/results/smollm2-h200-12/abl/muon4/eval.json
$PY -m dflash_train.eval.compare $B $A/lr48/eval.json $A/b32/eval.json --prompts 1-24 --prompts 25-40 --prompts 1-40 \
  --choose 25-40 --min-se 0 --skip-missing --json $A/compare.json > $A/compare.txt 2>&1; cat $A/compare.txt
if grep -q "^choice: .*lr48" $A/compare.txt; then echo "lr48" > $K/choice.txt
elif grep -q "^choice: .*b32" $A/compare.txt; then echo "b32" > $K/choice.txt; else echo "recipe" > $K/choice.txt; fi
cat $K/choice.txt
stage "replays and choice"
