#!/bin/bash
# call 2: the real SmolLM2 (xz GGUF parts -> HF folder); both committed answer sets; a THIRD set: prompts composed
# from request templates (recipes/composed_prompts.py, none of the first two sets' prompts, none near a
# never-trained prompt), answered greedily by SmolLM2 for as long as the call allows (what finishes is kept);
# all three tokenized (warm run of 3 steps); ONE ablation at the ninth run's ablation length (1.1 minutes of
# steps) with the ninth run's main recipe on all three sets, replayed (batched) on the 40 held-out prompts and
# compared with the ninth run's `reach` ablation (the same recipe and code on the first two sets alone); the
# main run's data chosen by a rule fixed here, before the runs: the composed set if its paired gain on prompts
# 25-40 is positive (eval.compare --choose 25-40 --min-se 0), else the first two sets with train.gamma=2.5.
set -u
source .gpu/s/env.sh
A=$K/abl
mkdir -p $A
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read warm.log gguf.sha256 choice.txt data3/*.log data3/prompts.log abl/*/train.log abl/*/eval.json abl/*/summary.json abl/*/metrics.jsonl abl/*/replay.log abl/compare.json abl/compare.txt 2>/dev/null); cp $K/greedy-answers-3.tar.xz $OUT/ 2>/dev/null' EXIT
cat $K/m/part_1 .gpu/g2/part_2 | xz -dc > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ln -sfn $K/smollm2 assets/smollm2
bash docs/results/smollm2-h200-8/scripts/both-sets.sh $D
stage "model and data ready"
REGEN=$(( $(left) - 330 )); [ $REGEN -gt 240 ] && REGEN=240
echo "regeneration budget ${REGEN}s"
DFT="$DFT" PY=$PY NGPU=1 NUM_SYNTH=0 NUM_COMPOSED=${NUM_COMPOSED:-50000} SEED=2 SEED_PROMPTS=0 \
  EXCLUDE="$D/greedy-0.jsonl $D/greedy-1.jsonl" OUT=$K/data3 REGEN_SECONDS=$REGEN \
  bash src/dflash_train/recipes/smollm2/data.sh > $K/data3.log 2>&1
mkdir -p $K/data3; mv $K/data3.log $K/data3/prompts.log
cat $K/data3/prompts.log | grep -v "^\s*$" | tail -6; tail -2 $K/data3/regen-0.log
cp $K/data3/greedy-0.jsonl $D/greedy-2.jsonl
(cd $K/data3 && tar cf - greedy-0.jsonl | xz -T8 -9 > $K/greedy-answers-3.tar.xz) &
stage "composed set answered: $(wc -l < $D/greedy-2.jsonl)"
set_common
timeout $(( $(left) - 8 )) $DFT train $COMMON train.run_dir=$K/warm train.max_steps=3 train.time_budget_minutes=0 \
  > $K/warm.log 2>&1
grep -h -i "read\|trim\|kept\|steps/epoch\|feature cache\|first step\|too_few" $K/warm.log | head -10
stage "tokenized, recipe compiled"
# as run, the ablation went without this line and stopped at start-up (three sets need 168 GiB of features: more
# than the GPU holds, refused with a message); it was rerun at once in a separate call, c2b.sh
EXTRA="train.feature_cache_gib=124"; set_common
ABL_MIN=${ABL_MIN:-1.1}
n=comp; d=$A/$n; mkdir -p $d
echo "train.loss_positions=8 train.reach_weighting=true (3 sets)" > $d/overrides.txt
timeout $(( $(left) - 70 )) $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=$ABL_MIN \
  train.log_every=50 train.save_every_minutes=0 train.loss_positions=8 train.reach_weighting=true > $d/train.log 2>&1
cp $d/run/summary.json $d/run/metrics.jsonl $d/ 2>/dev/null
stage "ablation $n: $(grep -o 'spent at step [0-9]*' $d/train.log | tail -1)"
REPLAY_ARGS=--batched timeout $(( $(left) - 10 )) bash .gpu/s/replayrun.sh $d/run $d
B=docs/results/smollm2-h200-10/abl/reach/eval.json
$PY -m dflash_train.eval.compare $B $d/eval.json --prompts 1-24 --prompts 25-40 --prompts 1-40 \
  --choose 25-40 --min-se 0 --skip-missing --json $A/compare.json > $A/compare.txt 2>&1; cat $A/compare.txt
if grep -q "^choice: .*comp" $A/compare.txt; then echo "comp" > $K/choice.txt; else echo "g25" > $K/choice.txt; fi
cat $K/choice.txt
if [ "$(cat $K/choice.txt)" = g25 ] && [ $(left) -gt 60 ]; then  # call 3 then trains on two sets: tokenize them now
  mkdir -p $D/off && mv $D/greedy-2.jsonl $D/off/ && set_common
  timeout $(( $(left) - 5 )) $DFT train $COMMON train.run_dir=$K/warm2 train.max_steps=1 train.time_budget_minutes=0 > $K/warm2.log 2>&1
fi
wait
stage "replay and choice"
