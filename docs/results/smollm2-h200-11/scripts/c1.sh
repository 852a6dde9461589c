#!/bin/bash
# call 1: only the GGUF's first part (xz) onto the machine, kept for call 2 (the two parts do not fit one call)
set -u
source .gpu/s/env.sh
mkdir -p $K/m $K/tok
cp .gpu/g1/part_1 $K/m/ && cp .gpu/tok/* $K/tok/
nvidia-smi -L
ls -la $K/m
stage "part 1 kept"
