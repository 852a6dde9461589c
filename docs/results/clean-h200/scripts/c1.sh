#!/usr/bin/env bash
# call 4: assemble and convert SmolLM2, unpack the answer sets, the decontamination count, DFlash (the recipe) 2 min
source docs/results/clean-h200/scripts/env.sh
cp .gpu/p*/part_* $K/m/
if [ ! -f $K/smollm2/config.json ]; then
  mkdir -p $K/gguf && cat $K/m/part_* | xz -dc > $K/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum $K/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/gguf/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" 2>&1 | tail -2
  rm -rf assets/smollm2 && ln -sfn $K/smollm2 assets/smollm2
fi
stage setup
mkdir -p $D/.s
for i in 1 2 3; do tar xJf docs/results/data/greedy-answers-$i.tar.xz -C $D/.s greedy-0.jsonl && mv $D/.s/greedy-0.jsonl $D/greedy-$((i-1)).jsonl; done
wc -l $D/greedy-*.jsonl; stage data
$DFT data inspect --data $D/greedy-0.jsonl $D/greedy-1.jsonl $D/greedy-2.jsonl --tokenizer assets/smollm2 --max-length 512 --block-size 16 --trim-loops --cache-dir $K/cache > $RES/inspect.log 2>&1
grep -A12 "^data:" $RES/inspect.log | head -14; stage inspect
train_arm dflash 2.0
