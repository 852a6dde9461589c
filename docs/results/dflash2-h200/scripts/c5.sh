#!/usr/bin/env bash
# call 5: export the 8-minute dflash2 + D-PACE run; static-engine eval on the 40 held-out prompts, fp32 then bf16
source .gpu/s/env.sh
R=$K/main2
$DFT export $R/run $R/drafter --target assets/smollm2 --force --dtype float32 > $OUT/export.log 2>&1; echo "export rc=$?"; stage export
for dt in float32 bfloat16; do
  timeout $(( $(left) - 15 )) $DFT eval --target assets/smollm2 --drafter $R/drafter --prompts heldout --limit 40 --block-size 16 --dtype $dt --max-new-tokens 128 --linear splitk --compile --compile-steps draft --fuse-projections --out $OUT/eval40-$dt > $OUT/eval-$dt.log 2>&1
  echo "eval $dt rc=$?"; tail -4 $OUT/eval-$dt.log; stage "eval $dt"
done
cp $R/drafter/config.json $OUT/drafter-config.json
