#!/bin/bash
# call 4: the decoding-step benchmark (GPU 0, alone), then the tau-vs-compute runs (the main run's
# config, 0.5 / 1 / 2 minutes of steps on one GPU each; one GPU: one after another, each eval in the
# background while the next trains; two GPUs: the 2-minute run on GPU 0 beside the others on GPU 1),
# and the curve with its fit.
set -u
source .gpu/s/env.sh
SEL=$(cat $K/main/selection.txt 2>/dev/null)
MAIN_MIN=${MAIN_MIN:-6}
CS=${CS:-1}  # curve minutes scale (a CPU dry run uses a small one)
NG=${NG:-2}
mkdir -p $K/curve
trap '(cd $K && tar czf $OUT/c4.tgz --ignore-failed-read main/eval40/eval.json main/eval40/eval.log curve/*/eval.json curve/*/eval.log curve/*/train.log curve/*/summary.json curve/*/metrics.jsonl 2>/dev/null); cp $OUT/stages.log $OUT/stages-c4.log 2>/dev/null' EXIT

train_curve() {  # train_curve NAME MINUTES GPU: skipped when the call has no time left for it
  local need=$(python3 -c "print(int($2*$CS*60+100))")
  if [ $(left) -lt $need ]; then echo "skip curve run $1: $(left) s left, needs $need"; return; fi
  mkdir -p $K/curve/$1
  env $(gpu $3) timeout --signal=TERM $(( $(left) - 40 )) $DFT train $COMMON $SEL train.run_dir=$K/curve/$1/run \
    train.time_budget_minutes=$(python3 -c "print($2*$CS)") train.log_every=25 > $K/curve/$1/train.log 2>&1
  cp $K/curve/$1/run/summary.json $K/curve/$1/run/metrics.jsonl $K/curve/$1/ 2>/dev/null
}
eval_curve() {  # eval_curve NAME GPU
  [ -d $K/curve/$1/run ] && env $(gpu $2) timeout $(( $(left) > 20 ? $(left) - 10 : 10 )) bash .gpu/s/evalrun.sh \
    $K/curve/$1/run $K/curve/$1 --limit 24 --no-baseline --no-compile
}

env $(gpu 0) timeout 110 $PY -m dflash_train.decoding.bench_steps --target assets/smollm2 --drafter $K/main/eval24/drafter \
  --dtype float32 --device $DEV --variants cudagraph-stock,cudagraph,compile+cudagraph,compile+cudagraph-fused,cudagraph-fused --time-budget-s 85 --out $OUT/steps.json > $OUT/steps.log 2>&1
stage "decoding step benchmark"
G=$((NG - 1))
( train_curve m05 0.5 $G; eval_curve m05 $G & train_curve m1 1 $G; eval_curve m1 $G & [ "$NG" = 1 ] && train_curve m2 2 0 && eval_curve m2 0; wait ) > $OUT/curve.log 2>&1 &
if [ "$NG" = 2 ]; then ( train_curve m2 2 0; eval_curve m2 0; env $(gpu 0) timeout 100 bash .gpu/s/evalrun.sh $K/main/run $K/main/eval40 --no-baseline --no-compile ) >> $OUT/curve.log 2>&1; fi
wait
stage "curve runs + evals"
GM=$(python3 -c "print($NG*$MAIN_MIN)")
$PY -m dflash_train.eval.scaling --point 0.5=$K/curve/m05/eval.json --point 1=$K/curve/m1/eval.json \
  --point 2=$K/curve/m2/eval.json --point $GM=$K/main/eval24/eval.json --prompts 1-24 --goal 3 \
  --out $OUT/tau_vs_compute.png --json $OUT/tau_vs_compute.json | tee $OUT/scaling.log
stage "done"
