#!/bin/bash
# call 1: the GGUF's first part (xz) onto the machine; unprofiled step times on a random-weight SmolLM2-shaped
# target (2,000 synthetic conversations, feature cache on the GPU) for the eighth run's main recipe
# (train.loss_positions=8), + train.reach_weighting, + train.num_anchors=32 (this also compiles call 2's
# shapes into the kept inductor cache); then the GPU tests of the compiled loss and the graphed step
# (reach weighting and loss_positions included: new)
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
K8="train.feature_cache=device train.loss_positions=8"
for v in "k8:$K8" "reach:$K8 train.reach_weighting=true" "a32:$K8 train.num_anchors=32"; do
  n=${v%%:*}; ov=${v#*:}; mkdir -p $OUT/v/$n
  [ $(left) -lt 60 ] && { echo "no time for $n"; break; }
  timeout $(( $(left) - 50 )) $PY .gpu/s/steps.py $K/smolrand .gpu/syn/synth2k.jsonl /tmp/v/$n data.cache_dir=$K/cache \
    $ov > $OUT/v/$n/log 2>&1
  tail -1 $OUT/v/$n/log
  stage "variant $n"
done
timeout $(( $(left) - 4 )) $PY -m pytest -m gpu -v -p no:cacheprovider -rs --tb=short tests/gpu/test_gpu_train.py \
  -k "compiled_loss_equals_eager or step_as_cuda_graph" > $OUT/gpu-tests.log 2>&1
tail -8 $OUT/gpu-tests.log
stage "gpu tests"
wait; ls -la $K/m
