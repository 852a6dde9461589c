#!/bin/bash
set -u
source .gpu/common.sh
export TORCHINDUCTOR_CACHE_DIR=/root/keep/inductor-e
python3 - <<'PY' > $OUT/make-q8.log 2>&1
import time, torch
from transformers import AutoTokenizer
from dflash_train.bench.run import build_target
t = time.time()
target = build_target("qwen3-8b", torch.device("cuda:0"), torch.bfloat16)
target.model.save_pretrained("/root/q8"); AutoTokenizer.from_pretrained("assets/smollm2").save_pretrained("/root/q8")
print("saved in", time.time() - t)
PY
C="qwen3-8b target.path=/root/q8 data.paths=[.gpu/data/synth.jsonl] data.pack=true data.cache_dir=/root/keep/cache8 train.num_anchors=128 train.time_budget_minutes=0.5 train.progress=false train.log_every=5 train.epochs=100"
timeout 170 torchrun --nproc-per-node 2 -m dflash_train.distributed.launch $C train.run_dir=/root/r8/disagg --target-ranks 1 --drafter-ranks 1 2>&1 | ts > $OUT/q8-disagg.log
CUDA_VISIBLE_DEVICES=0 timeout 110 $DFT plan $C train.run_dir=/root/r8/plan --gpus 2 --steps 2 > $OUT/q8-plan.log 2>&1
cd /root/r8 && tar czf $OUT/q8-runs.tgz */metrics.jsonl */summary.json */target-rank*.jsonl 2>/dev/null
echo done
