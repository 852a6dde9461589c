#!/usr/bin/env bash
# wheels into /tmp/site; the SmolLM2 folder at /root/keep/smollm2 (assembled and converted once); assets/smollm2 linked
set -e
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/keep/site .whl/*.whl; fi
export PYTHONPATH=$PWD/src:$PWD/tests:/root/keep/site
if [ ! -f /root/keep/smollm2/config.json ]; then
  mkdir -p /root/keep/gguf
  cat /root/keep/m/part_1 .gpu/g2/part_2 .gpu/g2/part_3 | xz -dc > /root/keep/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum /root/keep/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  HF_HUB_OFFLINE=1 python3 -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('/root/keep/gguf/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('/root/keep/smollm2'))"
fi
mkdir -p assets && rm -rf assets/smollm2 && ln -s /root/keep/smollm2 assets/smollm2
