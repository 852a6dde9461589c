#!/usr/bin/env bash
# call 1: park the first GGUF part and answer set 2 outside the repo copy; wheels installed
OUT=${OUT:-<tmp>/o}; source .gpu/s/env.sh
mkdir -p $K/m $K/tar && cp .gpu/g1/part_1 $K/m/ && cp .gpu/g1/*.tar.xz $K/tar/ && ls -l $K/m $K/tar && nvidia-smi --query-gpu=name,memory.used --format=csv
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
