#!/usr/bin/env bash
# call 2 (carry .gpu/g2; the tree without the answer tarballs): the GGUF assembled and checked, converted once to
# an HF folder in $K/smollm2 (assets/smollm2 links to it)
source docs/results/selection-2026-12-07/scripts/env.sh
if [ ! -f $K/smollm2/config.json ]; then
  mkdir -p $K/gguf && cat $K/m/part_00 .gpu/g2/part_01 | xz -dc > $K/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  (cd $K/gguf && echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c)
  python3 -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/gguf/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" 2>&1 | tail -2
  rm -rf assets/smollm2 && ln -sfn $K/smollm2 assets/smollm2
fi
ls $K/smollm2; stage convert
