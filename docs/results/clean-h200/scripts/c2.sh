#!/usr/bin/env bash
# call 5: DFlash2 + D-PACE (its objective of the 2026-12-03 kinds run) 5 min; DFlash's fp32 evaluation
source docs/results/clean-h200/scripts/env.sh
train_arm dflash2 5.0 drafter.kind=dflash2 train.objective=dpace train.reach_weighting=false
eval_arm dflash float32
