#!/usr/bin/env bash
# call 2 (and 3: rerun, finished arms are kept): SmolLM2, the answer sets, FP8 feature error, kinds arms
source .gpu/s/env.sh
bash .gpu/s/setup.sh; stage setup
mkdir -p $D
if [ ! -s $D/greedy-2.jsonl ]; then
  for i in 1 2 3; do
    src=.gpu/g2/greedy-answers-$i.tar.xz; [ -f $src ] || src=$K/tar/greedy-answers-$i.tar.xz
    [ -f $src ] || continue
    t=$(mktemp -d $D/.u.XXXX); tar xJf $src -C $t greedy-0.jsonl && mv $t/greedy-0.jsonl $D/greedy-$((i-1)).jsonl; rm -rf $t
  done
fi
wc -l $D/*.jsonl; stage data
if [ ! -s $OUT/fp8-features-data.json ] && [ ! -s $K/fp8-features-data.json ]; then
  $DFT bench-fp8-features --target assets/smollm2 --data $D/greedy-0.jsonl --rows 256 --layer-ids 1,10,18,27 --device cuda --out $K/fp8-features-data.json > $K/fp8f.log 2>&1; echo "fp8 features rc=$?"
  $DFT bench-fp8-features --target assets/smollm2 --rows 40 --layer-ids 1,10,18,27 --device cuda --out $K/fp8-features-heldout.json >> $K/fp8f.log 2>&1
  cp $K/fp8-features-*.json $K/fp8f.log $OUT/; stage fp8-features
fi
mkdir -p $K/kinds; cp -n .gpu/s/ref/refs.json $K/kinds/
for a in dflash dflash2; do mkdir -p $K/kinds/$a; cp -n .gpu/s/ref/$a/* $K/kinds/$a/; done
ARMS=${ARMS:-"dflash2-inject dflash-fp8target dflash2-seed1"}
timeout $(( $(left) - 25 )) env OUT=$K/kinds DFT="$DFT" ARMS="$ARMS" EXTRA="data.cache_dir=$K/cache" DATA=$D TARGET=assets/smollm2 \
  bash src/dflash_train/recipes/smollm2/kinds.sh 2>&1 | tee $OUT/kinds.out
echo "kinds rc=${PIPESTATUS[0]}"
ALL="dflash2 dflash2-inject dflash2-seed1 dflash-fp8target"
v=(); for a in $ALL; do v+=($K/kinds/$a); done
$DFT compare $K/kinds/dflash "${v[@]}" --prompts 1-24 --prompts 25-40 --prompts 1-40 --skip-missing --json $K/kinds/compare-dflash.json > $K/kinds/compare-dflash.txt 2>&1
$DFT compare $K/kinds/dflash2 $K/kinds/dflash2-inject $K/kinds/dflash2-seed1 --prompts 1-24 --prompts 25-40 --prompts 1-40 --skip-missing --json $K/kinds/compare-dflash2.json > $K/kinds/compare-dflash2.txt 2>&1
cat $K/kinds/compare-dflash.txt $K/kinds/compare-dflash2.txt
(cd $K && tar czf $OUT/kinds.tgz --exclude=run --exclude=drafter --exclude=refs.json kinds)
stage done
