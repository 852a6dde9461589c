#!/bin/bash
# export a run's newest checkpoint (fp32) and replay it on the 40 held-out prompts (exact greedy tau,
# no verify steps; the target's continuations come from $K/refs.json, made once):
#   bash .gpu/s/replayrun.sh RUN OUTDIR
source .gpu/s/env.sh
run=$1 out=$2
mkdir -p "$out"
$DFT export "$run" "$out/drafter" --target assets/smollm2 --force --dtype float32 > "$out/export.log" 2>&1 &&
$PY -m dflash_train.eval.replay --target assets/smollm2 --drafter "$out/drafter" --prompts $HELD --limit $RL \
  --max-new-tokens $RT --dtype float32 --device $DEV --references $K/refs.json ${REPLAY_ARGS:-} --out "$out" > "$out/replay.log" 2>&1
echo "replay $out rc=$? $(grep -o 'mean tau [0-9.]*' $out/replay.log)"
