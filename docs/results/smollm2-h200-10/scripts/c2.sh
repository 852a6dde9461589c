#!/bin/bash
# call 2: the real SmolLM2 (xz GGUF parts -> HF folder); both committed answer sets, tokenized (warm run of 3
# steps); then four ablations at EQUAL GPU TIME, alone on the GPU one after the other (ABL_MIN minutes of steps
# each), replayed (batched) on the 40 held-out prompts, and the main run's choice written by select.py:
#   k8      the eighth run's main recipe (train.loss_positions=8): the base
#   reach   + train.reach_weighting=true
#   g25     + train.gamma=2.5 (a sharper fixed decay: is reach's effect only that?)
#   a32     + train.num_anchors=32
set -u
source .gpu/s/env.sh
A=$K/abl
mkdir -p $A
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read warm.log gguf.sha256 choice.txt abl/*/train.log abl/*/eval.json abl/*/summary.json abl/*/metrics.jsonl abl/*/replay.log abl/compare.json abl/compare.txt 2>/dev/null)' EXIT
cat $K/m/part_1 .gpu/g2/part_2 | xz -dc > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ln -sfn $K/smollm2 assets/smollm2
bash docs/results/smollm2-h200-8/scripts/both-sets.sh $D
stage "model and data ready"
set_common
timeout $(( $(left) - 8 )) $DFT train $COMMON train.run_dir=$K/warm train.max_steps=3 train.time_budget_minutes=0 \
  > $K/warm.log 2>&1
grep -h -i "read\|trim\|kept\|steps/epoch\|feature cache\|first step" $K/warm.log | head -8
stage "tokenized, recipe compiled"
ABL_MIN=${ABL_MIN:-1.1}
K8="train.loss_positions=8"
for v in "k8|$K8" "reach|$K8 train.reach_weighting=true" "g25|$K8 train.gamma=2.5" "a32|$K8 train.num_anchors=32"; do
  n=${v%%|*}; ov=${v#*|}; d=$A/$n; mkdir -p $d
  [ $(left) -lt 200 ] && { echo "no time for $n"; break; }
  echo "$ov" > $d/overrides.txt
  timeout $(( $(left) - 110 )) $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=$ABL_MIN \
    train.log_every=50 train.save_every_minutes=0 $ov > $d/train.log 2>&1
  cp $d/run/summary.json $d/run/metrics.jsonl $d/ 2>/dev/null
  stage "ablation $n: $(grep -o 'spent at step [0-9]*' $d/train.log | tail -1)"
done
REPLAY_ARGS=--batched timeout $(( $(left) - 60 )) bash .gpu/s/replayrun.sh $A/k8/run $A/k8  # makes refs.json
for n in reach g25 a32; do
  [ -d $A/$n/run ] && REPLAY_ARGS=--batched timeout $(( $(left) - 8 )) bash .gpu/s/replayrun.sh $A/$n/run $A/$n &
done
wait
# only the reports that exist (as run, a32's missing report failed the whole comparison and select.py)
$PY -m dflash_train.eval.compare $A/k8/eval.json $(ls $A/{reach,g25,a32}/eval.json 2>/dev/null) \
  --prompts 1-24 --prompts 25-40 --prompts 1-40 --json $A/compare.json > $A/compare.txt 2>&1; cat $A/compare.txt
$PY .gpu/s/select.py $A > $K/choice.txt; cat $K/choice.txt
stage "replays"
