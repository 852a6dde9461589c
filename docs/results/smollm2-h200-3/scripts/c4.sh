#!/bin/bash
# call 4: the main run (one GPU, the selected overrides, MAIN_MIN minutes of steps); its reported evals
# alone on the GPU (first 24 held-out prompts, static engine, CUDA graphs, fused projections; fp32 with
# split-K few-row matmuls, then bf16; speedup over plain decoding; lossless check); its replay on all
# 40; the tau-vs-compute fit over the curve runs and the main run.
set -u
source .gpu/s/env.sh
SEL=$(cat $K/abl/selection.txt 2>/dev/null)
MAIN_MIN=${MAIN_MIN:-5.5}
mkdir -p $K/main
trap 'cp $K/main/run/metrics.jsonl $K/main/run/summary.json $K/main/ 2>/dev/null; (cd $K && tar czf $OUT/c4.tgz --ignore-failed-read main/train.log main/metrics.jsonl main/summary.json main/selection.txt main/eval24/eval.json main/eval24/eval.log main/eval24/eval.png main/eval24/export.log main/eval24-bf16/eval.json main/eval24-bf16/eval.log main/replay/eval.json main/replay/replay.log tau_vs_compute.json scaling.log 2>/dev/null); cp $K/tau_vs_compute.png $OUT/ 2>/dev/null; cp $OUT/stages.log $OUT/stages-c4.log 2>/dev/null' EXIT
echo "$SEL" > $K/main/selection.txt
echo "main run: $MAIN_MIN min on 1 GPU, overrides: $SEL" | tee $OUT/main-cmd.txt
timeout --signal=TERM $(( $(left) - 130 )) torchrun --nproc-per-node 1 -m dflash_train.cli train \
  $COMMON $SEL train.run_dir=$K/main/run train.time_budget_minutes=$MAIN_MIN train.log_every=50 2>&1 | ts > $K/main/train.log
stage "main run done"
tail -3 $K/main/train.log
# uncompiled graphs: compiling makes every step faster but the plain one most (measured 11-30:
# verify+draft over plain 2.90 stock vs 3.58 compiled), and costs ~60 s per eval
env $(gpu 0) timeout $(( $(left) - 80 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24 --limit 24 --no-compile --linear splitk --fuse-projections
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24/eval.log | head -24
stage "main eval fp32 (24 prompts)"
DTYPE=bfloat16 env $(gpu 0) timeout $(( $(left) - 30 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24-bf16 --limit 24 --no-compile --fuse-projections
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24-bf16/eval.log | head -24
stage "main eval bf16 (24 prompts)"
timeout $(( $(left) - 8 )) bash .gpu/s/replayrun.sh $K/main/run $K/main/replay
stage "main replay (40 prompts)"
pts=""
for spec in m05:0.5 m1:1 m2:2; do n=${spec%%:*}; [ -s $K/curve/$n/eval.json ] && pts="$pts --point ${spec##*:}=$K/curve/$n/eval.json"; done
$PY -m dflash_train.eval.scaling $pts --point $MAIN_MIN=$K/main/replay/eval.json --prompts 1-24 --goal 3 \
  --out $K/tau_vs_compute.png --json $K/tau_vs_compute.json > $K/scaling.log 2>&1; cat $K/scaling.log
stage "done"
