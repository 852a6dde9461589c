#!/usr/bin/env bash
# wheels into <tmp>/site; the SmolLM2 folder at $KEEP/smollm2 (assembled and converted once); assets/smollm2 linked
set -e
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $KEEP/site .whl/*.whl; fi
export PYTHONPATH=$PWD/src:$PWD/tests:$KEEP/site
if [ ! -f $KEEP/smollm2/config.json ]; then
  mkdir -p $KEEP/gguf
  cat $KEEP/m/part_1 .gpu/g2/part_2 .gpu/g2/part_3 | xz -dc > $KEEP/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum $KEEP/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  HF_HUB_OFFLINE=1 python3 -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$KEEP/gguf/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$KEEP/smollm2'))"
fi
mkdir -p assets && rm -rf assets/smollm2 && ln -s $KEEP/smollm2 assets/smollm2
