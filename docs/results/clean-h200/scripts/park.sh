#!/usr/bin/env bash
# calls 1-3: park one part of the xz-compressed SmolLM2 GGUF (and, in call 1, the wheels) outside the repo copy
OUT=${OUT:-<tmp>/o}; source docs/results/clean-h200/scripts/env.sh
mkdir -p $K/m && cp .gpu/p*/part_* $K/m/ && ls -l $K/m && nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
