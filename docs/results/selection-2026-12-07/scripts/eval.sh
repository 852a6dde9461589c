#!/usr/bin/env bash
# call 5 (the whole tree): the arm chosen on selection ($CHOSEN) on the held-out prompts 1-24, as reproduce.sh
# evaluates (static engine, compiled draft step, fused projections; fp32 with split-K, then bf16): kept-token tau,
# speedup, lossless; then its bfloat16 export, split in parts that the tool brings back
source docs/results/selection-2026-12-07/scripts/env.sh
D=$K/kinds/$CHOSEN
EV=(--target assets/smollm2 --drafter $D/drafter --prompts heldout --limit 24 --block-size 16 --max-new-tokens 128
    --engine static --compile --compile-steps draft --fuse-projections)
mkdir -p $RES/heldout/$CHOSEN
timeout $(( $(left) - 60 )) $DFT eval "${EV[@]}" --dtype float32 --linear splitk --out $RES/heldout/$CHOSEN/eval24 > $RES/heldout/$CHOSEN/eval24.log 2>&1
tail -4 $RES/heldout/$CHOSEN/eval24.log; stage "eval fp32 $CHOSEN"
timeout $(( $(left) - 40 )) $DFT eval "${EV[@]}" --dtype bfloat16 --out $RES/heldout/$CHOSEN/eval24-bf16 > $RES/heldout/$CHOSEN/eval24-bf16.log 2>&1
tail -4 $RES/heldout/$CHOSEN/eval24-bf16.log; stage "eval bf16 $CHOSEN"
$DFT export $D/run $K/served --target assets/smollm2 --force --dtype bfloat16 > $RES/heldout/$CHOSEN/export-bf16.log 2>&1
tar -C $K -cf - served | xz -T8 -3 > $K/served.tar.xz && split -b 15M -d $K/served.tar.xz $OUT/served.tar.xz.part_
sha256sum $K/served.tar.xz | tee $RES/heldout/$CHOSEN/served.sha256; ls -l $OUT; stage "export bf16 $CHOSEN"
