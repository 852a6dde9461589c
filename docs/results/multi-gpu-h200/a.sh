#!/bin/bash
set -u
source .gpu/common.sh
nvidia-smi --query-gpu=name,memory.used --format=csv > $OUT/nvsmi.txt 2>&1
python3 -c "import torch,transformers,datasets;print(torch.__version__,transformers.__version__,datasets.__version__)" >> $OUT/nvsmi.txt 2>&1
export TORCHINDUCTOR_CACHE_DIR=/root/keep/inductor; rm -rf $TORCHINDUCTOR_CACHE_DIR
CUDA_VISIBLE_DEVICES=0 timeout 250 $DFT bench $REF --steps 6 --warmup 2 --device cuda --out $OUT/ref-cold.json 2>&1 | ts > $OUT/ref-cold.log
CUDA_VISIBLE_DEVICES=0 timeout 100 $DFT bench $REF --steps 8 --warmup 2 --device cuda --out $OUT/ref-warm.json 2>&1 | ts > $OUT/ref-warm.log
unset TORCHINDUCTOR_CACHE_DIR
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/gpu/test_gpu_distributed.py -k match_one_gpu 2>&1 | ts > $OUT/gpu-tests.log
echo done
