#!/usr/bin/env bash
# call 1 (carry .gpu/g1 .gpu/w; the tree without the answer tarballs): the wheels and the GGUF's first part into $K
source docs/results/selection-2026-12-07/scripts/env.sh
mkdir -p $K/m && cp .gpu/g1/part_* $K/m/ && ls -l $K/m
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $RES/card.txt
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a $RES/card.txt
stage park1
