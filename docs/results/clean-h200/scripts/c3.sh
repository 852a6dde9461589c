#!/usr/bin/env bash
# call 6: the other evaluations and replays; the paired comparisons
source docs/results/clean-h200/scripts/env.sh
eval_arm dflash bfloat16
eval_arm dflash2 float32
eval_arm dflash2 bfloat16
replay_arm dflash
replay_arm dflash2
for s in heldout-float32 selection; do
  $DFT compare $RES/dflash/$s $RES/dflash2/$s --json $RES/compare-$s.json
done
