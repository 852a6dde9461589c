#!/bin/bash
# call 5: the main run's held-out evaluations (static engine: CUDA graphs, fused projections, the draft step
# compiled; lossless check; speedup): first 24 prompts fp32 with the few-row Triton kernel (LIN, default triton),
# the same with split-K (the engine until now: the same drafter, so the step times compare directly), bf16,
# all 40 fp32 with LIN; then, with the time left, the exact greedy tau (replay) on the 96 `selection` prompts
# (never trained on, never used for a report).
set -u
source .gpu/s/env.sh
LIN=${LIN:-triton}
trap '(cd $K && tar czf $OUT/c5.tgz --ignore-failed-read main/eval24/eval.json main/eval24/eval.log main/eval24/eval.png main/eval24/export.log main/eval24-splitk/eval.json main/eval24-splitk/eval.log main/eval24-bf16/eval.json main/eval24-bf16/eval.log main/eval40/eval.json main/eval40/eval.log main/selection/eval.json main/selection/replay.log 2>/dev/null)' EXIT
EV="--compile --compile-steps draft --fuse-projections"
timeout $(( $(left) - 200 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24 --limit 24 $EV --linear $LIN
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24/eval.log | head -24
stage "main eval fp32 $LIN"
timeout $(( $(left) - 140 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24-splitk --limit 24 $EV --linear splitk
grep -E "tau|speedup|lossless| ms" $K/main/eval24-splitk/eval.log | head -8
stage "main eval fp32 splitk"
DTYPE=bfloat16 timeout $(( $(left) - 80 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24-bf16 --limit 24 $EV
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24-bf16/eval.log | head -24
stage "main eval bf16"
timeout $(( $(left) - 30 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval40 --limit 40 $EV --linear $LIN
grep -E "tau|speedup|lossless" $K/main/eval40/eval.log | head -8
stage "main eval40 fp32"
if [ $(left) -gt 60 ]; then
  mkdir -p $K/main/selection
  timeout $(( $(left) - 5 )) $PY -m dflash_train.eval.replay --target assets/smollm2 --drafter $K/main/eval24/drafter \
    --prompts selection --max-new-tokens 128 --dtype float32 --device cuda --references $K/refs-selection.json --batched \
    --out $K/main/selection > $K/main/selection/replay.log 2>&1
  grep -o "mean tau [0-9.]*" $K/main/selection/replay.log
  stage "selection replay"
fi
