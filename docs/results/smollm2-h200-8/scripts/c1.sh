#!/bin/bash
# call 1: GGUF part 1 onto the machine; unprofiled step times of the recipe on a random SmolLM2-shaped
# target with half of the feature cache in host memory (the sixth run's steps.py "on" variant is the same
# with all of it on the GPU; this also warms the compile cache); the GPU test of the spilled cache
set -u
source .gpu/s/env.sh
mkdir -p $K/m $K/tok
cp .gpu/a/part_aa $K/m/ &
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
# synth2k's cache is 2.91 GiB (1,959 conversations, 677,482 tokens x 2,304 bf16 features): 1.45 = half
for v in "spill:train.feature_cache=device train.feature_cache_gib=1.45"; do
  n=${v%%:*}; ov=${v#*:}; mkdir -p $OUT/v/$n
  [ $(left) -lt 45 ] && { echo "no time for $n"; break; }
  timeout $(( $(left) - 8 )) $PY .gpu/s/steps.py $K/smolrand .gpu/syn/synth2k.jsonl /tmp/v/$n data.cache_dir=$K/cache \
    $ov > $OUT/v/$n/log 2>&1
  tail -1 $OUT/v/$n/log
  stage "variant $n"
done
timeout $(( $(left) - 5 )) $PY -m pytest -m gpu -v -p no:cacheprovider -rs --tb=short tests/gpu/test_gpu_train.py \
  -k "spilled_to_host" > $OUT/gpu-tests.log 2>&1
tail -5 $OUT/gpu-tests.log
stage "gpu tests"
wait; ls -la $K/m
