#!/bin/bash
# call 5 (the ninth run's c4.sh): the main run's held-out evaluations (static engine: CUDA graphs, fused projections, the draft step
# compiled; lossless check; speedup): first 24 prompts fp32 with split-K, then bf16, then all 40 fp32
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c5.tgz --ignore-failed-read main/eval24/eval.json main/eval24/eval.log main/eval24/eval.png main/eval24/export.log main/eval24-bf16/eval.json main/eval24-bf16/eval.log main/eval40/eval.json main/eval40/eval.log 2>/dev/null)' EXIT
EV="--compile --compile-steps draft --fuse-projections"
timeout $(( $(left) - 130 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24 --limit 24 $EV --linear splitk
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24/eval.log | head -24
stage "main eval fp32"
DTYPE=bfloat16 timeout $(( $(left) - 70 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24-bf16 --limit 24 $EV
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24-bf16/eval.log | head -24
stage "main eval bf16"
timeout $(( $(left) - 6 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval40 --limit 40 $EV --linear splitk
grep -E "tau|speedup|lossless" $K/main/eval40/eval.log | head -8
stage "main eval40 fp32"
