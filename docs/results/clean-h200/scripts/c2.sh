#!/usr/bin/env bash
# call 5: DFlash2 + D-PACE (its objective of the 2026-12-03 kinds run, chosen then on heldout 1-24) and
# DSpark with the recipe's objective (as DFlash's), 2 minutes each
source docs/results/clean-h200/scripts/env.sh
train_arm dflash2 2.0 drafter.kind=dflash2 objective.weighting=dpace
train_arm dspark 2.0 drafter.kind=dspark
