#!/bin/bash
# call 2 (carry .gpu/g2 .gpu/s .whl; the tree without sets 2 and 3): the real SmolLM2 (xz GGUF parts -> HF
# folder in /root/keep/smollm2); answer set 1 into /root/keep; the GPU tests of the few-row Triton kernel
# (decoding/few_rows.py: against float64 on SmolLM2's product shapes, inside a CUDA graph; the static decoder
# with it, graphed and compiled, against the reference loop); then the decoder's three steps timed in float32
# (bench_steps, random 4-layer drafter of the recipe's shape: a step's cost does not depend on its weights)
# with split-K (the engine until now) and with the kernel.
set -u
source .gpu/s/env.sh
cp docs/results/smollm2-h200-6/data/greedy-answers.tar.xz $K/
cat $K/m/part_1 .gpu/g2/part_2 | xz -dc > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ls $K/smollm2; cp $K/gguf.sha256 $OUT/
stage "model ready"
ln -sfn $K/smollm2 assets/smollm2
timeout $(( $(left) - 130 )) $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_replay.py \
  -k "few_rows or (split_k_fused and triton)" 2>&1 | tail -15 | tee $OUT/gpu-tests.log
stage "GPU tests"
timeout $(( $(left) - 5 )) $PY -m dflash_train.decoding.bench_steps --target assets/smollm2 --dtype float32 \
  --variants compile-draft+cudagraph-fused-splitk,compile-draft+cudagraph-fused-triton --out $OUT/steps-fp32.json \
  2>&1 | tail -4 | tee $OUT/steps-fp32.log
stage "steps timed"
