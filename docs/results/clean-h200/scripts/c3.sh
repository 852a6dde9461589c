#!/usr/bin/env bash
# call 6: the three drafters on the 40 heldout prompts, float32 then bfloat16; the paired comparisons
source docs/results/clean-h200/scripts/env.sh
for dt in float32 bfloat16; do
  for arm in dflash dflash2 dspark; do eval_arm $arm $dt; done
done
for arm in dflash2 dspark; do
  $DFT compare $RES/dflash/heldout-float32 $RES/$arm/heldout-float32 --prompts 1-24 --prompts 1-40 \
    --json $RES/compare-$arm.json > $RES/compare-$arm.txt 2>&1
done
cat $RES/compare-*.txt
