#!/bin/bash
# call 1 (carry .gpu/g1 .gpu/s .whl; the tree without sets 1 and 2): the GGUF's first part and answer set 3
# into /root/keep.
set -u
source .gpu/s/env.sh
mkdir -p $K/m $K/tok
cp .gpu/g1/part_1 $K/m/ && cp docs/results/smollm2-h200-11/data/greedy-answers-3.tar.xz $K/
nvidia-smi -L
ls -la $K/m $K/*.tar.xz
stage "part 1 and set 3 kept"
