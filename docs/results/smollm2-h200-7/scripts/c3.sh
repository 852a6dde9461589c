#!/bin/bash
# call 3: the main run (the recipe, the compile mode call 2 chose), MAIN_MIN minutes of steps alone on the
# GPU; then its held-out evals (first 24 prompts, static engine: CUDA graphs, fused projections, the draft
# step compiled; fp32 with split-K, then bf16; lossless check; speedup over plain decoding).
set -u
source .gpu/s/env.sh
MAIN_MIN=${MAIN_MIN:-6}
MODE=$(cat $K/mode.txt 2>/dev/null || echo default)
mkdir -p $K/main
trap 'cp $K/main/run/metrics.jsonl $K/main/run/summary.json $K/main/ 2>/dev/null; (cd $K && tar czf $OUT/c3.tgz --ignore-failed-read main/train.log main/metrics.jsonl main/summary.json main/eval24/eval.json main/eval24/eval.log main/eval24/eval.png main/eval24/export.log main/eval24-bf16/eval.json main/eval24-bf16/eval.log main/cmd.txt 2>/dev/null)' EXIT
echo "$DFT train $COMMON train.run_dir=RUN train.time_budget_minutes=$MAIN_MIN train.log_every=100 train.compile_mode=$MODE" | tee $K/main/cmd.txt
timeout --signal=TERM $(( $(left) - 150 )) $DFT train $COMMON train.run_dir=$K/main/run train.time_budget_minutes=$MAIN_MIN \
  train.log_every=100 train.compile_mode=$MODE 2>&1 | ts > $K/main/train.log
stage "main run done"
grep -E "first step|feature cache|steps|time budget" $K/main/train.log | head; tail -3 $K/main/train.log
EV="--limit 24 --compile --compile-steps draft --fuse-projections"
timeout $(( $(left) - 70 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24 $EV --linear splitk
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24/eval.log | head -24
stage "main eval fp32"
DTYPE=bfloat16 timeout $(( $(left) - 6 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24-bf16 $EV
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24-bf16/eval.log | head -24
stage "main eval bf16"
