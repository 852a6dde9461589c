#!/usr/bin/env bash
# call 2: SmolLM2 assembled and converted; the three answer sets unpacked to $K/data; the first kinds arms
source .gpu/s/env.sh
bash .gpu/s/setup.sh 2>&1 | tail -3; stage setup
cp .gpu/g2/*.tar.xz $K/tar/
mkdir -p $D/.s
for i in 1 2 3; do tar xJf $K/tar/greedy-answers-$i.tar.xz -C $D/.s greedy-0.jsonl && mv $D/.s/greedy-0.jsonl $D/greedy-$((i-1)).jsonl; done
wc -l $D/greedy-*.jsonl; sha256sum $K/tar/*.tar.xz; stage data
ARMS=${ARMS:-"dflash2 dflash"} bash .gpu/s/callD.sh
