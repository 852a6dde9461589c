#!/usr/bin/env bash
# call 4 (the whole tree): reproduce.sh's eval stage on the recipe's drafter (held-out prompts 1-24, 128 new
# tokens, static engine, fp32 with split-K then bf16: kept-token tau, speedup, lossless), then its bfloat16 export
# split in parts that come back through $OUT
source docs/results/selection-2026-12-07/scripts/env.sh
R=$K/recipe
export DATA=$K/data RUN=$R/run EXPORT=$R/drafter DFT PY=python3
STAGES=eval bash src/dflash_train/recipes/smollm2/reproduce.sh > $R/eval.log 2>&1
echo "eval rc=$?"; grep -E "^== |tau|speedup|lossless|error" $R/eval.log | tail -14
mkdir -p $RES/recipe/eval24 $RES/recipe/eval24-bf16
cp -f $R/eval.log $RES/recipe/; cp -f $R/run/eval24/eval.json $RES/recipe/eval24/; cp -f $R/run/eval24-bf16/eval.json $RES/recipe/eval24-bf16/
$DFT export $R/run $K/served --target assets/smollm2 --force --dtype bfloat16 > $RES/recipe/export-bf16.log 2>&1
tar -C $K -cf - served | xz -T8 -3 > $K/served.tar.xz && split -b 15M -d $K/served.tar.xz $OUT/served.tar.xz.part_
sha256sum $K/served.tar.xz | tee $RES/recipe/served.sha256; ls -l $OUT $K/served; stage "recipe eval + bf16 export"
