#!/usr/bin/env bash
# Issue 59 item 2 in one device call (carry .gpu/w .gpu/smoltok .gpu/old): the static engine's steps before the one
# decoding core (.gpu/old = `git archive fdf37de^ src`, the last commit before issue 59's decoding changes) and after
# (this tree), taking turns A B A B on one machine; a SmolLM2-135M-shaped target with random weights (a step's cost
# does not depend on its weights), float32, a random drafter in the recipe's shape.
source docs/results/selection-2026-12-07/scripts/env.sh
VARIANTS=${VARIANTS:-cudagraph,compile+cudagraph-splitk,compile-draft+cudagraph-fused}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $RES/card.txt
if [ ! -f $K/smolrand/model.safetensors ]; then
  python3 - <<PY
import shutil, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
src, dst = Path(".gpu/smoltok"), Path("$K/smolrand")
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
PY
fi
stage target
mkdir -p $RES/dec
for round in 1 2; do
  for side in after before; do
    src=$PWD/src; [ $side = before ] && src=$PWD/.gpu/old/src
    PYTHONPATH=$src:$K/site timeout $(( $(left) - 5 )) python3 -m dflash_train.cli bench-decode --target $K/smolrand \
      --dtype float32 --device cuda --variants $VARIANTS --out $RES/dec/$side-$round.json > $RES/dec/$side-$round.log 2>&1
    echo "$side $round rc $?"; stage "$side-$round"
  done
done
