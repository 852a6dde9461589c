#!/bin/bash
# speed exploration on a random-weight SmolLM2 (same shapes as the real one): few-row fp32 GEMM
# formulations, the decoder's steps per linear mode, replay on the GPU, the GPU tests of the static decoder
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/src:/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s); stage() { echo "== $1: $(( $(date +%s) - T0 ))s" | tee -a $OUT/stages.log; }
mkdir -p $OUT /tmp/rand assets
python3 - <<'PY'
import shutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.from_pretrained(".gpu/s")
torch.manual_seed(0)
AutoModelForCausalLM.from_config(cfg).save_pretrained("/tmp/rand")
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(".gpu/s/" + f, "/tmp/rand/" + f)
from dflash_train.models.target import Target
from dflash_train.models.config import DrafterConfig, resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.export.serving import export_drafter
t = Target.load("/tmp/rand", dtype=torch.float32, device="cpu")
c = resolve_drafter_config(DrafterConfig(num_hidden_layers=4, block_size=16), t.facts, mask_token_id=3)
export_drafter(DFlashDrafter(c), c, "/tmp/rdrafter", tokenizer=t.tokenizer, force=True)
PY
ln -sfn /tmp/rand assets/smollm2
nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
stage "random model + drafter"
timeout 90 python3 .gpu/s/gemm.py $OUT/gemm.json > $OUT/gemm.log 2>&1
stage "gemm"
timeout 150 python3 -m dflash_train.decoding.bench_steps --target assets/smollm2 --drafter /tmp/rdrafter --dtype float32 --device cuda \
  --variants cudagraph,cudagraph-splitk,cudagraph-mm_t,cudagraph-cublaslt,compile+cudagraph-splitk --time-budget-s 120 --out $OUT/steps.json > $OUT/steps.log 2>&1
stage "steps fp32"
timeout 40 python3 -m dflash_train.decoding.bench_steps --target assets/smollm2 --drafter /tmp/rdrafter --dtype bfloat16 --device cuda \
  --variants cudagraph,cudagraph-splitk --time-budget-s 25 --out $OUT/steps-bf16.json > $OUT/steps-bf16.log 2>&1
stage "steps bf16"
timeout 90 python3 -m dflash_train.eval.replay --target assets/smollm2 --drafter /tmp/rdrafter --prompts heldout --limit 40 \
  --max-new-tokens 128 --dtype float32 --references /tmp/refs.json --out /tmp/replay > $OUT/replay.log 2>&1
stage "replay 40 (refs made)"
timeout 40 python3 -m dflash_train.eval.replay --target assets/smollm2 --drafter /tmp/rdrafter --prompts heldout --limit 40 \
  --max-new-tokens 128 --dtype float32 --references /tmp/refs.json --out /tmp/replay >> $OUT/replay.log 2>&1
stage "replay 40 (refs reused)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_static.py > $OUT/gpu-tests.log 2>&1
stage "gpu tests (static)"
