#!/bin/bash
set -u
source .gpu/common.sh
R=/root/keep/runs; mkdir -p $R
export TORCHINDUCTOR_CACHE_DIR=/root/keep/inductor-d
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/gpu/test_gpu_train.py -k "flex or sparse" 2>&1 | ts > $OUT/gpu-tests.log
python3 - <<'PY' >> $OUT/gpu-tests.log 2>&1
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
c = AutoConfig.from_pretrained("assets/smollm2")
m = AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16)
m.save_pretrained("/root/keep/smol-random"); AutoTokenizer.from_pretrained("assets/smollm2").save_pretrained("/root/keep/smol-random")
PY
C="smollm2-1gpu target.path=/root/keep/smol-random data.paths=[.gpu/data/synth.jsonl] data.cache_dir=/root/keep/cache eval.prompts=null train.time_budget_minutes=0.4 train.progress=false train.log_every=10"
(CUDA_VISIBLE_DEVICES=0 timeout 100 $DFT train $C train.run_dir=$R/one 2>&1 | ts > $OUT/one.log) &
(CUDA_VISIBLE_DEVICES=1 timeout 80 $DFT bench $REF --steps 8 --warmup 2 --device cuda --out $OUT/ref1.json > $R/ref1.log 2>&1
 CUDA_VISIBLE_DEVICES=1 timeout 75 $DFT plan $C train.run_dir=$R/plan --gpus 2 > $R/plan.log 2>&1) &
wait
timeout 110 torchrun --nproc-per-node 2 -m dflash_train.distributed.launch $C train.run_dir=$R/disagg --target-ranks 1 --drafter-ranks 1 2>&1 | ts > $OUT/disagg.log
timeout 110 torchrun --nproc-per-node 2 -m dflash_train.cli train $C train.run_dir=$R/coloc 2>&1 | ts > $OUT/coloc.log
timeout 80 torchrun --nproc-per-node 2 -m dflash_train.cli bench $REF --steps 8 --warmup 2 --device cuda --out $OUT/ref2.json > $R/ref2.log 2>&1
cd $R && tar czf $OUT/runs.tgz */metrics.jsonl */summary.json */target-rank*.jsonl *.log 2>/dev/null
echo done
