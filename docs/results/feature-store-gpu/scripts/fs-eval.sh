#!/usr/bin/env bash
# issue 58 on the GPU, call 4 (the whole tree, within ~30 s of fs-train.sh): held-out tau at equal steps per
# mode (each run of fs-train.sh exported, evaluated on held-out prompts 1-24 as feature_store_bench.py's
# --tau-prompts does), then the Qwen3-8B-shaped reference bench (its target_forward phase is what a store saves
# per step) and the decoder bench of SmolLM2 (issue 59's static-engine baseline); results in $K/res/fs
source docs/results/selection-2026-12-07/scripts/env.sh
for run in $K/sb/run-*; do
  m=${run##*/run-}; [ -s $RES/fs/eval-$m.json ] && continue
  [ "$(left)" -lt 90 ] && { echo "== $m: not evaluated, $(left) s left"; continue; }
  $DFT export $run $run/drafter --target assets/smollm2 --force > $RES/fs/export-$m.log 2>&1 &&
  timeout $(( $(left) - 60 )) $DFT eval --target assets/smollm2 --drafter $run/drafter --prompts heldout --limit 24 \
    --out $run/eval > $RES/fs/eval-$m.log 2>&1 && cp $run/eval/eval.json $RES/fs/eval-$m.json
  stage "eval $m"
done
if [ "$(left)" -gt 150 ]; then
  timeout $(( $(left) - 60 )) $DFT bench REF --batch-size 1 --steps 16 --warmup 2 --device cuda > $RES/fs/ref-bf16.json 2> $RES/fs/ref.log
  stage ref-bench
fi
if [ "$(left)" -gt 100 ]; then
  timeout $(( $(left) - 20 )) $DFT bench-decode --target assets/smollm2 > $RES/fs/bench-decode.json 2> $RES/fs/bench-decode.log
  stage bench-decode
fi
