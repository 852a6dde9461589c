#!/usr/bin/env bash
# session 2026-12-04b call 1: the REF FP8 + compiled-target line with --kernels 12 (where the drafter's forward goes),
# the same for bf16 compiled target, then the GPU test of bench --kernels
source .gpu/s/env.sh
[ -e assets/smollm2 ] || ln -s $PWD/.gpu/tok assets/smollm2
stage start
nvidia-smi --query-gpu=name,memory.used,clocks.max.sm --format=csv
REF="--target-config qwen3-8b --drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --batch-size 1 --warmup 2 --attention flex --compile --device cuda"
for v in "fp8-ct-k:--steps 8 --target-fp8 --compile-target --kernels 12" "bf16-ct-k:--steps 8 --compile-target --kernels 12"; do
  name=${v%%:*}; flags=${v#*:}
  [ $(left) -gt 120 ] || break
  timeout $(( $(left) - 100 )) $DFT bench $REF $flags --out $OUT/ref-$name.json > $OUT/ref-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "import json;d=json.load(open('$OUT/ref-$name.json'));print(round(d['context_tokens_per_s']), round(d['mfu'],3), d['peak_memory_gib'], d['first_step_s'], d['phase_seconds'])" 2>&1 | tail -1)"
  tail -3 $OUT/ref-$name.log
  stage $name
done
timeout $(( $(left) - 10 )) python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rfEs --tb=short tests/bench/test_kernels.py > $OUT/test_kernels.log 2>&1
echo "test_kernels rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/test_kernels.log | head -20; stage test_kernels
