#!/bin/bash
# call 4: the main run (the recipe alone on one GPU, MAIN_MIN minutes of steps); its reported evals
# alone on the GPU (first 24 held-out prompts, static engine, CUDA graphs, fused projections, the
# draft step compiled, the target's steps not; fp32 with split-K few-row matmuls, then bf16;
# speedup over plain decoding on the same target engine; lossless check); the tau-vs-compute fit over
# the curve runs of call 3 (replayed) and the main run (its fp32 eval: replay gives the same taus).
set -u
source .gpu/s/env.sh
MAIN_MIN=${MAIN_MIN:-6}
S1=${S1:-360}
mkdir -p $K/main
trap 'cp $K/main/run/metrics.jsonl $K/main/run/summary.json $K/main/ 2>/dev/null; (cd $K && tar czf $OUT/c4.tgz --ignore-failed-read main/train.log main/metrics.jsonl main/summary.json main/eval24/eval.json main/eval24/eval.log main/eval24/eval.png main/eval24/export.log main/eval24-bf16/eval.json main/eval24-bf16/eval.log tau_vs_compute.json scaling.log 2>/dev/null); cp $K/tau_vs_compute.png $OUT/ 2>/dev/null' EXIT
echo "main run: $MAIN_MIN min on 1 GPU, the recipe" | tee $OUT/main-cmd.txt
timeout --signal=TERM $(( $(left) - 150 )) torchrun --nproc-per-node 1 -m dflash_train.cli train \
  $COMMON train.run_dir=$K/main/run train.time_budget_minutes=$MAIN_MIN train.log_every=50 2>&1 | ts > $K/main/train.log
stage "main run done"
tail -3 $K/main/train.log
EV="--limit 24 --compile --compile-steps draft --fuse-projections"
env $(gpu 0) timeout $(( $(left) - 70 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24 $EV --linear splitk
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24/eval.log | head -24
stage "main eval fp32 (24 prompts)"
# GPU-minutes of each curve run: its steps at the main run's own steps per minute (alone on the GPU)
RATE=$($PY -c "import json; s=json.load(open('$K/main/run/summary.json')); print(s['steps'] / $MAIN_MIN)" 2>/dev/null || echo $S1)
pts=""
for n in m05 base m2; do
  st=$($PY -c "import json; print(json.load(open('$K/runs/$n/summary.json'))['steps'])" 2>/dev/null) || continue
  [ -s $K/runs/$n/eval.json ] && pts="$pts --point $($PY -c "print(round($st / $RATE, 3))")=$K/runs/$n/eval.json"
done
$PY -m dflash_train.eval.scaling $pts --point $MAIN_MIN=$K/main/eval24/eval.json --prompts 1-24 --goal 3 \
  --out $K/tau_vs_compute.png --json $K/tau_vs_compute.json > $K/scaling.log 2>&1; cat $K/scaling.log
DTYPE=bfloat16 env $(gpu 0) timeout $(( $(left) - 6 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24-bf16 $EV
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24-bf16/eval.log | head -24
stage "main eval bf16 (24 prompts)"
stage "done"
