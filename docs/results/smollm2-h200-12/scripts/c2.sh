#!/bin/bash
# call 2 (carry .gpu/g2 .gpu/s .whl; the tree without sets 2 and 3): the real SmolLM2 (xz GGUF parts -> HF
# folder in /root/keep/smollm2); answer set 1 into /root/keep; the GPU test of the graphed training step with
# Muon (real CUDA graph capture: the Newton-Schulz iterations and the device-side skip inside the graph) and
# the AdamW case with the recipe's objective options.
set -u
source .gpu/s/env.sh
cp docs/results/smollm2-h200-6/data/greedy-answers.tar.xz $K/
cat $K/m/part_1 .gpu/g2/part_2 | xz -dc > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ls $K/smollm2; cp $K/gguf.sha256 $OUT/
stage "model ready"
ln -sfn $K/smollm2 assets/smollm2
timeout $(( $(left) - 5 )) $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_train.py \
  -k "step_as_cuda_graph and (muon or k2)" 2>&1 | tail -15 | tee $OUT/gpu-tests.log
stage "GPU tests"
