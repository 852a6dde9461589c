#!/usr/bin/env bash
# call 5: the FP8 target-compile test as rewritten, then the GPU tests of the code changed since the last full
# suite (FP8 linears, MoE, the static decoder and replay with DFlash2's walk), each file's log kept
source .gpu/s/env.sh
[ -e assets/smollm2 ] || ln -s $PWD/.gpu/tok assets/smollm2
stage start
for f in test_gpu_target_compile test_gpu_fp8 test_gpu_moe test_gpu_static test_gpu_replay; do
  [ $(left) -gt 40 ] || { echo "$f: not run (time)"; continue; }
  timeout $(( $(left) - 15 )) python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rfEs --tb=short tests/gpu/$f.py > $OUT/$f.log 2>&1
  echo "$f rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/$f.log | head -12; stage $f
done
