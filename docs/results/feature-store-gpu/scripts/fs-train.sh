#!/usr/bin/env bash
# issue 58 on the GPU, call 3 (the whole tree, after ../../selection-2026-12-07/scripts/c1.sh and c2.sh parked
# SmolLM2): the feature store bench on smollm2-1gpu, the recipe's decontaminated answers (greedy-0, first
# $N conversations), $EPOCHS epochs per mode; results in $K/res/fs (bench.json, bench.log)
source docs/results/selection-2026-12-07/scripts/env.sh
N=${N:-8000}; EPOCHS=${EPOCHS:-2}; MODES=${MODES:-online,cache,store-bfloat16,store-float8,hybrid}
if [ ! -s $K/data/greedy-0.jsonl ]; then
  STAGES=data DATA=$K/data PY=python3 bash src/dflash_train/recipes/smollm2/reproduce.sh | tail -3; stage data
fi
mkdir -p $RES/fs; df -h $K | tail -1 | tee $RES/fs/disk.txt
timeout $(( $(left) - 20 )) python3 scripts/feature_store_bench.py smollm2-1gpu "data.paths=[$K/data/greedy-0.jsonl]" \
  data.max_examples=$N data.cache_dir=$K/cache train.time_budget_minutes=0 --out $K/sb --epochs $EPOCHS \
  --modes $MODES --source-timing 32 > $RES/fs/bench.json 2> >(grep -v "^  *[a-z]" > $RES/fs/bench.log)
echo "bench rc $?"; tail -4 $RES/fs/bench.log; du -sh $K/sb/store-* 2>/dev/null | tee $RES/fs/store-sizes.txt
stage fs-train
