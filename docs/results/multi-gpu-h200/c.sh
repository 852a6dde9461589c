#!/bin/bash
set -u
source .gpu/common.sh
export TORCHINDUCTOR_CACHE_DIR=/root/keep/inductor-c; rm -rf $TORCHINDUCTOR_CACHE_DIR
CUDA_VISIBLE_DEVICES=0 timeout 200 $DFT bench $REF --steps 8 --warmup 2 --device cuda --out $OUT/ref-cold.json 2>&1 | ts > $OUT/ref-cold.log
CUDA_VISIBLE_DEVICES=0 timeout 100 $DFT bench $REF --steps 8 --warmup 2 --device cuda --out $OUT/ref-warm.json 2>&1 | ts > $OUT/ref-warm.log
timeout 150 torchrun --nproc-per-node 2 -m dflash_train.cli bench $REF --steps 8 --warmup 2 --device cuda --out $OUT/ref-2gpu.json 2>&1 | ts > $OUT/ref-2gpu.log
unset TORCHINDUCTOR_CACHE_DIR
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/gpu/test_gpu_train.py tests/gpu/test_gpu_static.py tests/bench tests/distributed/test_timings.py 2>&1 | ts > $OUT/gpu-tests.log
echo done
