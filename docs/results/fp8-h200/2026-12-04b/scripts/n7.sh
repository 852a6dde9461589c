#!/usr/bin/env bash
# session 2026-12-04b call 2: REF FP8 + compiled target with the clip folded into the fused AdamW, with and without
# --cuda-graph-step; a sweep of flex attention kernel_options at the drafter's shapes; the kernels test (fixed)
source .gpu/s/env.sh
[ -e assets/smollm2 ] || ln -s $PWD/.gpu/tok assets/smollm2
stage start
REF="--target-config qwen3-8b --drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --batch-size 1 --warmup 2 --attention flex --compile --device cuda"
for v in "fp8-ct-fold:--steps 16 --target-fp8 --compile-target" "fp8-ct-fold-graph:--steps 16 --target-fp8 --compile-target --cuda-graph-step --kernels 12"; do
  name=${v%%:*}; flags=${v#*:}
  [ $(left) -gt 200 ] || break
  timeout $(( $(left) - 150 )) $DFT bench $REF $flags --out $OUT/ref-$name.json > $OUT/ref-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "import json;d=json.load(open('$OUT/ref-$name.json'));print(round(d['context_tokens_per_s']), round(d['mfu'],3), d['peak_memory_gib'], d['first_step_s'], d['phase_seconds'])" 2>&1 | tail -1)"
  stage $name
done
timeout $(( $(left) - 45 )) python3 .gpu/s/flex_sweep.py > $OUT/flex-sweep.log 2>&1; echo "sweep rc=$?"; grep -v "^{" $OUT/flex-sweep.log | grep -v Warn | tail -14; stage sweep
timeout $(( $(left) - 5 )) python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rfEs --tb=short tests/bench/test_kernels.py > $OUT/test_kernels.log 2>&1
echo "test_kernels rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/test_kernels.log | head -20; stage test_kernels
