#!/bin/bash
set -u
source .gpu/common.sh
which py-spy > $OUT/pyspy.txt 2>&1
export TORCHINDUCTOR_CACHE_DIR=/root/keep/inductor-prof; rm -rf $TORCHINDUCTOR_CACHE_DIR
(CUDA_VISIBLE_DEVICES=0 timeout 280 py-spy record -r 20 -f raw -o $OUT/cold.prof -- python3 -m dflash_train.cli bench $REF --steps 2 --warmup 1 --device cuda --out $OUT/ref-prof.json > $OUT/ref-prof.log 2>&1; gzip -f $OUT/cold.prof) &
unset TORCHINDUCTOR_CACHE_DIR
timeout 280 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/gpu/test_gpu_distributed.py 2>&1 | ts > $OUT/gpu-tests.log
wait
echo done
