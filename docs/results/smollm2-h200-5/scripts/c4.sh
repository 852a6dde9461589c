#!/bin/bash
# call 4: the main run: the recipe plus the call-3 variant that beat base on held-out prompts 25-40
# (paired mean difference > 2 standard errors and > 0.02; prompts 1-24 stay for the report), with
# the feature cache on the GPU if call 3 saw it work; MAIN_MIN minutes of steps alone on the GPU;
# then its evals alone (first 24 held-out prompts, static engine, CUDA graphs, fused projections,
# the draft step compiled; fp32 with split-K, then bf16; lossless check; speedup over plain).
set -u
source .gpu/s/env.sh
MAIN_MIN=${MAIN_MIN:-6}
mkdir -p $K/main
trap 'cp $K/main/run/metrics.jsonl $K/main/run/summary.json $K/main/ 2>/dev/null; (cd $K && tar czf $OUT/c4.tgz --ignore-failed-read main/train.log main/metrics.jsonl main/summary.json main/eval24/eval.json main/eval24/eval.log main/eval24/eval.png main/eval24/export.log main/eval24-bf16/eval.json main/eval24-bf16/eval.log main/choice.txt 2>/dev/null)' EXIT
PICK=$($PY - $K/runs/compare.json <<'PY'
import json, sys
try:
    rows = [r for r in json.load(open(sys.argv[1])) if r["prompts"] == "25-40"]
except (OSError, ValueError):
    rows = []
good = [r for r in rows if r["mean_diff"] > max(0.02, 2 * r["stderr"])]
best = max(good, key=lambda r: r["mean_diff"], default=None)
print(best["variant"].split("/")[-2] if best else "base")
PY
)
OV=$(grep "^$PICK|" ${VARIANTS:-.gpu/s/variants.txt} | cut -d'|' -f2)
FC=$([ -f $K/fc_ok ] && echo train.feature_cache=device || echo "")
echo "main run: $MAIN_MIN min on 1 GPU, the recipe + [$PICK: $OV] + [$FC]" | tee $OUT/main-cmd.txt $K/main/choice.txt
timeout --signal=TERM $(( $(left) - 150 )) torchrun --nproc-per-node 1 -m dflash_train.cli train \
  $COMMON train.run_dir=$K/main/run train.time_budget_minutes=$MAIN_MIN train.log_every=50 $OV $FC 2>&1 | ts > $K/main/train.log
stage "main run done"
tail -4 $K/main/train.log
EV="--limit 24 --compile --compile-steps draft --fuse-projections"
env $(gpu 0) timeout $(( $(left) - 70 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24 $EV --linear splitk
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24/eval.log | head -24
stage "main eval fp32 (24 prompts)"
DTYPE=bfloat16 env $(gpu 0) timeout $(( $(left) - 6 )) bash .gpu/s/evalrun.sh $K/main/run $K/main/eval24-bf16 $EV
grep -E "tau|speedup|lossless|tok/s| ms|warn|fail" $K/main/eval24-bf16/eval.log | head -24
stage "main eval bf16 (24 prompts)"
