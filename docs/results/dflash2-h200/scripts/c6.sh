#!/usr/bin/env bash
# call 6: DFlash2's draft step, new walk vs the slot-by-slot one, on a random SmolLM2-shaped target; then the
# training step of dflash vs dflash2 (+ D-PACE) in the recipe's shape
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD/src:$PWD/tests
export TORCHINDUCTOR_CACHE_DIR=<tmp>/ind
T0=$(date +%s); LIMIT=${LIMIT:-225}
left() { echo $(( LIMIT - $(date +%s) + T0 )); }
R=<tmp>/rsm; mkdir -p $R && cp .gpu/tok/* $R/
python3 -c "
import torch, transformers as t
cfg = t.AutoConfig.from_pretrained('$R'); torch.manual_seed(0)
t.AutoModelForCausalLM.from_config(cfg).save_pretrained('$R')" 2>&1 | tail -2
V=compile-draft+cudagraph-fused-splitk
COMMON="--target $R --dtype float32 --variants $V --replays 300 --new-tokens 64"
timeout $(( $(left) - 5 )) python3 -m dflash_train.cli bench-decode $COMMON --drafter-kind dflash2 --out $OUT/walk-new.json > $OUT/walk-new.log 2>&1; echo "new rc=$? $(( $(date +%s) - T0 ))s"
timeout $(( $(left) - 5 )) python3 .gpu/s/walkab.py $COMMON --drafter-kind dflash2 --out $OUT/walk-old.json > $OUT/walk-old.log 2>&1; echo "old rc=$? $(( $(date +%s) - T0 ))s"
timeout $(( $(left) - 5 )) python3 -m dflash_train.cli bench-decode $COMMON --drafter-kind dflash --out $OUT/walk-dflash.json > $OUT/walk-dflash.log 2>&1; echo "dflash rc=$? $(( $(date +%s) - T0 ))s"
grep -h -A4 "variant " $OUT/walk-*.log
B="--target-config $R --drafter-layers 4 --block-size 16 --target-layer-ids 1,10,18,27 --num-anchors 64 --seq-len 512 --batch-size 32 --steps 10 --warmup 2 --attention flex --compile --device cuda --optim muon"
for kind in dflash2 dflash; do
  timeout $(( $(left) - 3 )) python3 -m dflash_train.cli bench $B --drafter-kind $kind --objective dpace --out $OUT/train-$kind-dpace.json > $OUT/train-$kind.log 2>&1; echo "train $kind rc=$? $(( $(date +%s) - T0 ))s"
done
