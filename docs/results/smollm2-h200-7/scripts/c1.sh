#!/bin/bash
# call 1: GGUF half a onto the machine; GPU tests of the step graph; unprofiled step times of the
# recipe on a random SmolLM2-shaped target (graph off / on / variants)
set -u
source .gpu/s/env.sh
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 && touch /tmp/site/.done; }
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
timeout 150 $PY -m pytest -m gpu -v -p no:cacheprovider -rs --tb=short tests/gpu/test_gpu_train.py \
  -k "step_as_cuda_graph or target_forward_as_cuda_graph" > $OUT/gpu-tests.log 2>&1
tail -5 $OUT/gpu-tests.log
stage "gpu tests"
for v in "on:train.cuda_graph_step=true" "off:train.cuda_graph_step=false" "a32:train.num_anchors=32"; do
  n=${v%%:*}; ov=${v#*:}; mkdir -p $OUT/v/$n
  [ $(left) -lt 45 ] && { echo "no time for $n"; break; }
  timeout $(( $(left) - 8 )) $PY .gpu/s/steps.py $K/smolrand .gpu/syn/synth2k.jsonl /tmp/v/$n data.cache_dir=$K/cache \
    train.feature_cache=device $ov > $OUT/v/$n/log 2>&1
  tail -1 $OUT/v/$n/log
  stage "variant $n"
done
wait; ls -la $K/m
