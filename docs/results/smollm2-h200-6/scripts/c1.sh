#!/bin/bash
# call 1: GGUF half a onto the machine; profile the recipe's step on a random SmolLM2-shaped target
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
K=/root/keep; mkdir -p $K/m
cp .gpu/a/part_aa $K/m/ &
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/w1/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD/src:/tmp/site TORCHINDUCTOR_CACHE_DIR=$K/inductor
python3 -m pip show pyarrow huggingface-hub fsspec pandas xxhash 2>/dev/null | grep -E "^(Name|Version)"
python3 -c "import datasets; print('datasets', datasets.__version__)"
nvidia-smi -L
python3 - <<'PY'
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
c = AutoConfig.from_pretrained(".gpu/tok")
m = AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16)
m.save_pretrained("/root/keep/smolrand"); AutoTokenizer.from_pretrained(".gpu/tok").save_pretrained("/root/keep/smolrand")
PY
mkdir -p $OUT/p
timeout 400 python3 .gpu/s/prof.py /root/keep/smolrand .gpu/s/synth2k.jsonl /tmp/p train.feature_cache=device 2>&1 | grep -v Warning | tail -30
cp /tmp/p/prof-*.txt /tmp/p/res.json $OUT/p/ 2>/dev/null
gzip -c /tmp/p/trace-cached.json > $OUT/p/trace-cached.json.gz; gzip -c /tmp/p/trace-target.json > $OUT/p/trace-target.json.gz
wait; ls -la $K/m
