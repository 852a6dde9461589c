#!/bin/bash
# call 1: the GGUF's first part (xz) onto the machine; unprofiled step times on a random-weight SmolLM2-shaped
# target (2,000 synthetic conversations, feature cache on the GPU) for the recipe and train.loss_positions=8
# (this also warms the compile cache for call 2); the GPU test of
# `regenerate --compact` (written in the seventh run, not run then)
set -u
source .gpu/s/env.sh
mkdir -p $K/m $K/tok
cp .gpu/g1/part_1 $K/m/ &
cp .gpu/tok/* $K/tok/ && ln -sfn $K/tok assets/smollm2
nvidia-smi -L
$PY - <<'PY'
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
c = AutoConfig.from_pretrained(".gpu/tok")
m = AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16)
m.save_pretrained("/root/keep/smolrand"); AutoTokenizer.from_pretrained(".gpu/tok").save_pretrained("/root/keep/smolrand")
PY
stage "random target"
for v in "base:train.feature_cache=device" "k8:train.feature_cache=device train.loss_positions=8"; do
  n=${v%%:*}; ov=${v#*:}; mkdir -p $OUT/v/$n
  [ $(left) -lt 50 ] && { echo "no time for $n"; break; }
  timeout $(( $(left) - 40 )) $PY .gpu/s/steps.py $K/smolrand .gpu/syn/synth2k.jsonl /tmp/v/$n data.cache_dir=$K/cache \
    $ov > $OUT/v/$n/log 2>&1
  tail -1 $OUT/v/$n/log
  stage "variant $n"
done
timeout $(( $(left) - 4 )) $PY -m pytest -m gpu -v -p no:cacheprovider -rs --tb=short tests/gpu/test_gpu_batched.py \
  > $OUT/gpu-tests.log 2>&1
tail -4 $OUT/gpu-tests.log
stage "gpu tests"
wait; ls -la $K/m
