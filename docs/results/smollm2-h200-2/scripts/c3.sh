#!/bin/bash
# call 3: the main run (NG GPUs colocated, the selected overrides, MAIN_MIN minutes of steps), then
# its reported eval alone on GPU 0: first 24 held-out prompts, fp32, static engine (steps compiled),
# speedup over plain decoding, lossless check.
set -u
source .gpu/s/env.sh
NG=${NG:-2}
SEL=${SEL:-$(cat $K/abl/selection.txt 2>/dev/null)}
MAIN_MIN=${MAIN_MIN:-6}
mkdir -p $K/main
trap 'cp $K/main/run/metrics.jsonl $K/main/run/summary.json $K/main/ 2>/dev/null; (cd $K && tar czf $OUT/c3.tgz --ignore-failed-read main/train.log main/metrics.jsonl main/summary.json main/selection.txt main/eval24/eval.json main/eval24/eval.log main/eval24/eval.png main/eval24/export.log 2>/dev/null); cp $OUT/stages.log $OUT/stages-c3.log 2>/dev/null' EXIT
echo "$SEL" > $K/main/selection.txt
echo "main run: $MAIN_MIN min on $NG GPUs, overrides: $SEL" | tee $OUT/main-cmd.txt
timeout --signal=TERM $(( $(left) - 110 )) torchrun --nproc-per-node $NG -m dflash_train.cli train \
  $COMMON $SEL train.run_dir=$K/main/run train.time_budget_minutes=$MAIN_MIN train.log_every=50 2>&1 | ts > $K/main/train.log
stage "main run done"
tail -4 $K/main/train.log
env $(gpu 0) timeout $(( $(left) - 5 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24 --limit 24
grep -E "tau|speedup|lossless|tok/s| ms" $K/main/eval24/eval.log | head -24
stage "main eval (24 prompts)"
