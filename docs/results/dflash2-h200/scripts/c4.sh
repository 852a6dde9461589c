#!/usr/bin/env bash
# call 4: the ablation's best (dflash2 + D-PACE) at the recipe's 8 minutes (the 13th run's command line)
source .gpu/s/env.sh
set_common
R=$K/main2; rm -rf $R; mkdir -p $R
echo "$DFT train $COMMON train.epochs=1000 train.feature_cache_gib=124 data.token_budget=16384 train.run_dir=$R/run train.time_budget_minutes=8.0 train.log_every=100 drafter.kind=dflash2 train.objective=dpace train.reach_weighting=false" > $OUT/cmd.txt
timeout $(( $(left) - 10 )) $DFT train $COMMON train.epochs=1000 train.feature_cache_gib=124 data.token_budget=16384 train.run_dir=$R/run train.time_budget_minutes=8.0 train.log_every=100 drafter.kind=dflash2 train.objective=dpace train.reach_weighting=false > $R/train.log 2>&1
echo "train rc=$?"; tail -5 $R/train.log; cp $R/train.log $R/run/metrics.jsonl $R/run/summary.json $OUT/ 2>/dev/null; stage train
