#!/bin/bash
# call 1: the first half of the GGUF onto the machine (the second comes with call 2)
source .gpu/s/env.sh
mkdir -p $K/m && cp .gpu/a/part_aa $K/m/ && ls -la $K/m
nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
