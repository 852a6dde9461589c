#!/usr/bin/env bash
# call D: issue 35's kinds ablation (recipes/smollm2/kinds.sh) on the data prep.sh unpacked and tokenized
source .gpu/s/env.sh
export DATA=$D OUT_K=$K/kinds TARGET=assets/smollm2
ARMS=${ARMS:-"dflash dflash2 dflash2-dpace dflash-dpace"}
timeout $(( $(left) - 25 )) env OUT=$K/kinds DFT="$DFT" ARMS="$ARMS" EXTRA="data.cache_dir=$K/cache" \
  bash src/dflash_train/recipes/smollm2/kinds.sh 2>&1 | tee $OUT/kinds.out
echo "kinds rc=${PIPESTATUS[0]}"
if [ ! -s $K/kinds/compare.txt ]; then
  base=$K/kinds/dflash; v=(); for a in $ARMS; do [ $a = dflash ] || v+=($K/kinds/$a); done
  $DFT compare $base "${v[@]}" --prompts 1-24 --prompts 25-40 --prompts 1-40 --skip-missing --json $K/kinds/compare.json > $K/kinds/compare.txt 2>&1
  cat $K/kinds/compare.txt
fi
(cd $K && tar czf $OUT/kinds.tgz --exclude=run --exclude=drafter kinds)
