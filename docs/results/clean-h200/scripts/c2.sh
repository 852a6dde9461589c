#!/usr/bin/env bash
# call 5: DFlash2 + D-PACE (its objective of the 2026-12-03 kinds run, chosen then on heldout 1-24) 3 min;
# DFlash's evaluations
source docs/results/clean-h200/scripts/env.sh
train_arm dflash2 3.0 drafter.kind=dflash2 objective.weighting=dpace
eval_arm dflash float32
eval_arm dflash bfloat16
