#!/bin/bash
# export a run's newest checkpoint (fp32) and evaluate it on the held-out prompts:
#   bash .gpu/s/evalrun.sh RUN OUTDIR [extra eval args]
source .gpu/s/env.sh
run=$1 out=$2; shift 2
mkdir -p "$out"
$DFT export "$run" "$out/drafter" --target assets/smollm2 --force --dtype float32 > "$out/export.log" 2>&1 &&
$DFT eval --target assets/smollm2 --drafter "$out/drafter" --prompts $HELD --block-size 16 --dtype ${DTYPE:-float32} \
  --device $DEV --engine static --max-new-tokens ${EVAL_TOKENS:-128} --out "$out" "$@" > "$out/eval.log" 2>&1
echo "eval $out rc=$?"
