#!/usr/bin/env bash
# call 7: DSpark's evaluations; the paired comparisons on the 40 heldout prompts
source docs/results/clean-h200/scripts/env.sh
eval_arm dspark float32
eval_arm dspark bfloat16
for arm in dflash2 dspark; do
  $DFT compare $RES/dflash/heldout-float32 $RES/$arm/heldout-float32 --prompts 1-24 --prompts 1-40 \
    --json $RES/compare-$arm.json > $RES/compare-$arm.txt 2>&1
done
cat $RES/compare-*.txt
