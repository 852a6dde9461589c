#!/usr/bin/env bash
# call 6: DSpark with the recipe's objective (as DFlash's) 3 min; DFlash2's evaluations
source docs/results/clean-h200/scripts/env.sh
train_arm dspark 3.0 drafter.kind=dspark
eval_arm dflash2 float32
eval_arm dflash2 bfloat16
