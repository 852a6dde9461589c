#!/bin/bash
# The tau-vs-compute plot of the fourth run (README): two recipes, one line each. Run from the repo root.
O=docs/results/smollm2-h200-4 R=docs/results/smollm2-h200-5
A="third run's recipe: 64 rows/step" B="recipe now: 16 rows/step, loops trimmed, feature cache"
python -m dflash_train.eval.scaling \
  --point "$A@0.458=$O/runs/m05/eval.json" --point "$A@0.916=$O/runs/base/eval.json" \
  --point "$A@1.831=$O/runs/m2/eval.json" --point "$A@6=$O/main/eval24/eval.json" \
  --point "$B@0.6=$R/runs/bs16/eval.json" --point "$B@0.6=$R/runs2/bs16/eval.json" \
  --point "$B@6=$R/main/eval24/eval.json" \
  --prompts 1-24 --goal 2.5 --goal 3 --out $R/tau_vs_compute.png --json $R/tau_vs_compute.json
