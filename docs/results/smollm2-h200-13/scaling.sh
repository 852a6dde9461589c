#!/bin/bash
# The tau-vs-compute plot of the twelfth run (README): the two recipe lines of the fourth run, the fifth
# run's cheaper step, the sixth run's step replayed as one CUDA graph (same recipe, same data), the seventh run's 2.7x the answers (with its 1.1-minute ablation base of the eighth run), the eighth run's loss on block positions 1-8, the ninth run's reach weighting and the tenth run's composed prompts as a third answer set (each with its 1.1-minute ablation; the composed set alone at 1.1 minutes as one point), and the eleventh run's Muon (optim.name=muon, lr 2.4e-3) on the tenth run's data at 1.1, 3.0 and 8.0 minutes, and the twelfth run's Muon with 32 rows a step (1.1 and 8.0 minutes) and at lr 4.8e-3 (1.1). Run from
# the repo root.
O=docs/results/smollm2-h200-4 R=docs/results/smollm2-h200-5 S=docs/results/smollm2-h200-6 T=docs/results/smollm2-h200-7 U=docs/results/smollm2-h200-8 V=docs/results/smollm2-h200-9 W=docs/results/smollm2-h200-10 X=docs/results/smollm2-h200-11 Y=docs/results/smollm2-h200-12 Z=docs/results/smollm2-h200-13
A="third run's recipe: 64 rows/step" B="recipe: 16 rows/step, loops trimmed, feature cache"
C="same recipe and data, step made cheaper (compiled loss, target CUDA graph)"
D="same recipe and data, the whole step one CUDA graph"
E="the same step, 2.7x the answers (147K kept), 8.3 min (checkpoint at 7.95)"
F="the same, loss on block positions 1-8 only (train.loss_positions 8)"
G="the same + reach weighting (train.reach_weighting)"
H="the same + a third set: 45.8K composed prompts (190.8K kept), 8.0 min"
I="the composed set alone (43.4K kept)"
J="the same data as the third set's line, Muon for the weight matrices (lr 2.4e-3), 8.0 min"
L="the same with 32 rows a step (data.token_budget 16384), 8.0 min"
M="Muon at lr 4.8e-3"
python -m dflash_train.eval.scaling \
  --point "$A@0.458=$O/runs/m05/eval.json" --point "$A@0.916=$O/runs/base/eval.json" \
  --point "$A@1.831=$O/runs/m2/eval.json" --point "$A@6=$O/main/eval24/eval.json" \
  --point "$B@0.6=$R/runs/bs16/eval.json" --point "$B@0.6=$R/runs2/bs16/eval.json" \
  --point "$B@6=$R/main/eval24/eval.json" --point "$C@6=$S/main/eval24/eval.json" \
  --point "$D@6.5=$T/main/eval24/eval.json" --point "$E@1.1=$V/abl/base/eval.json" --point "$E@7.95=$U/main/eval24/eval.json" \
  --point "$F@1.1=$V/abl/k8/eval.json" --point "$F@8.2=$V/main/eval24/eval.json" \
  --point "$G@1.1=$W/abl/reach/eval.json" --point "$G@8.2=$W/main/eval24/eval.json" \
  --point "$H@1.1=$X/abl/comp/eval.json" --point "$H@8.0=$X/main/eval24/eval.json" --point "$I@1.1=$X/abl/conly/eval.json" \
  --point "$J@1.1=$Y/abl/muon4/eval.json" --point "$J@3.0=$Y/abl/m4-3min/eval.json" --point "$J@8.0=$Y/main/eval24/eval.json" \
  --point "$L@1.1=$Z/abl/b32/eval.json" --point "$L@8.0=$Z/main/eval24/eval.json" --point "$M@1.1=$Z/abl/lr48/eval.json" \
  --prompts 1-24 --goal 2.5 --goal 3 --out $Z/tau_vs_compute.png --json $Z/tau_vs_compute.json
