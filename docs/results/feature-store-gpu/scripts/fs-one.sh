#!/usr/bin/env bash
# issue 58 on the GPU in ONE call (the whole tree; carry .gpu/w .gpu/smoltok = SmolLM2's config and tokenizer,
# no weights): a SmolLM2-135M-shaped target with random weights (the same FLOPs and feature bytes as the real
# one; tau is not measured here), the feature-store bench on smollm2-1gpu (dump tokens/s, bytes/token, train
# tokens/s per mode), then the Qwen3-8B-shaped reference bench (its target_forward phase: what a store saves).
source docs/results/selection-2026-12-07/scripts/env.sh; export DFT
N=${N:-8000}; EPOCHS=${EPOCHS:-2}; MODES=${MODES:-online,cache,store-bfloat16,store-float8,hybrid}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $RES/card.txt
if [ ! -f $K/smolrand/model.safetensors ]; then
  python3 - <<PY
import shutil, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
src, dst = Path(".gpu/smoltok"), Path("$K/smolrand")
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
model.save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
PY
fi
rm -rf assets/smollm2 && ln -sfn $K/smolrand assets/smollm2; stage target
if [ ! -s $K/data/greedy-0.jsonl ]; then
  STAGES=data DATA=$K/data PY=python3 bash src/dflash_train/recipes/smollm2/reproduce.sh | tail -2; stage data
fi
mkdir -p $RES/fs
timeout $(( $(left) - ${REF_S:-110} )) python3 scripts/feature_store_bench.py smollm2-1gpu "data.paths=[$K/data/greedy-0.jsonl]" \
  data.max_examples=$N data.cache_dir=$K/cache train.time_budget_minutes=0 eval.prompts=null --out $K/sb --epochs $EPOCHS \
  --modes $MODES --source-timing ${SOURCE_TIMING:-32} ${TAU:+--tau-prompts $TAU} > $RES/fs/bench.json 2> >(grep -v "^  *[a-z]" > $RES/fs/bench.log)
echo "bench rc $?"; tail -3 $RES/fs/bench.log | cut -c1-400; du -sb $K/sb/store-* 2>/dev/null | tee $RES/fs/store-sizes.txt
stage fs-bench
if [ -z "${NO_REF:-}" ] && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 10 )) $DFT bench qwen3-8b target.path=qwen3-8b train.cuda_graph_step=false --batch-size 1 --steps 8 --warmup 2 --device cuda > $RES/fs/ref-bf16.json 2> $RES/fs/ref.log
  echo "ref rc $?"; stage ref-bench
fi
