#!/bin/bash
# call 2: the real SmolLM2 (xz GGUF parts -> HF folder); both committed answer sets; tokenized twice (the
# recipe, and with data.max_lookup_tau=2 in the background); then four ablations at EQUAL GPU TIME, alone on
# the GPU one after the other (ABL_MIN minutes of steps each), replayed (batched) on the 40 held-out prompts:
#   base   the recipe (the seventh run's)
#   k8     train.loss_positions=8
#   k8f    loss_positions=8 + data.max_lookup_tau=2
#   k8a32  loss_positions=8 + train.num_anchors=32
set -u
source .gpu/s/env.sh
A=$K/abl
mkdir -p $A
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read warm.log inspect-f.log gguf.sha256 abl/*/train.log abl/*/eval.json abl/*/summary.json abl/*/metrics.jsonl abl/*/replay.log abl/compare.json abl/compare.txt 2>/dev/null)' EXIT
cat $K/m/part_1 .gpu/g2/part_2 | xz -dc > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ln -sfn $K/smollm2 assets/smollm2
bash docs/results/smollm2-h200-8/scripts/both-sets.sh $D
stage "model and data ready"
set_common
$DFT data inspect --data $D/greedy-0.jsonl $D/greedy-1.jsonl --tokenizer assets/smollm2 --max-length 512 --block-size 16 \
  --trim-loops --max-lookup-tau 2 --cache-dir $K/cache --no-color > $K/inspect-f.log 2>&1 &
timeout $(( $(left) - 8 )) $DFT train $COMMON train.run_dir=$K/warm train.max_steps=3 train.time_budget_minutes=0 \
  > $K/warm.log 2>&1
grep -h -i "read\|trim\|kept\|steps/epoch\|feature cache\|first step" $K/warm.log | head -8
wait
grep -h -i "read\|kept\|mostly\|trimmed" $K/inspect-f.log | head -5
stage "tokenized (both), recipe compiled"
ABL_MIN=${ABL_MIN:-1.1}
for v in "base|" "k8|train.loss_positions=8" "k8f|train.loss_positions=8 data.max_lookup_tau=2" \
         "k8a32|train.loss_positions=8 train.num_anchors=32"; do
  n=${v%%|*}; ov=${v#*|}; d=$A/$n; mkdir -p $d
  [ $(left) -lt 150 ] && { echo "no time for $n"; break; }
  timeout $(( $(left) - 60 )) $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=$ABL_MIN \
    train.log_every=50 train.save_every_minutes=0 $ov > $d/train.log 2>&1
  cp $d/run/summary.json $d/run/metrics.jsonl $d/ 2>/dev/null
  stage "ablation $n: $(grep -o 'spent at step [0-9]*' $d/train.log | tail -1)"
done
REPLAY_ARGS=--batched timeout $(( $(left) - 30 )) bash .gpu/s/replayrun.sh $A/base/run $A/base  # makes refs.json
for n in k8 k8f k8a32; do
  [ -d $A/$n/run ] && REPLAY_ARGS=--batched timeout $(( $(left) - 6 )) bash .gpu/s/replayrun.sh $A/$n/run $A/$n &
done
wait
$PY -m dflash_train.eval.compare $A/base/eval.json $A/k8/eval.json $A/k8f/eval.json $A/k8a32/eval.json \
  --prompts 1-24 --prompts 25-40 --prompts 1-40 --json $A/compare.json > $A/compare.txt 2>&1; cat $A/compare.txt
stage "replays"
