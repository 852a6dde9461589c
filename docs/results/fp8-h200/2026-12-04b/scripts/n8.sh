#!/usr/bin/env bash
# session 2026-12-04b call 3: REF with the clip folded into AdamW and the loss's one-hot as a comparison:
# FP8 + compiled target (with --kernels 12), the bf16 rows from the same line, FP8 again; then the GPU tests of
# the loss, the graphed step and bench --kernels
source .gpu/s/env.sh
[ -e assets/smollm2 ] || ln -s $PWD/.gpu/tok assets/smollm2
stage start
REF="--target-config qwen3-8b --drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --batch-size 1 --steps 16 --warmup 2 --attention flex --compile --device cuda"
for v in "fp8-ct:--target-fp8 --compile-target --kernels 12" "bf16:" "bf16-ct:--compile-target" "fp8-ct-2:--target-fp8 --compile-target"; do
  name=${v%%:*}; flags=${v#*:}
  [ $(left) -gt 260 ] || break
  timeout $(( $(left) - 200 )) $DFT bench $REF $flags --out $OUT/ref-$name.json > $OUT/ref-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "import json;d=json.load(open('$OUT/ref-$name.json'));print(round(d['context_tokens_per_s']), round(d['mfu'],3), d['peak_memory_gib'], d['first_step_s'], d['phase_seconds'])" 2>&1 | tail -1)"
  stage $name
done
for f in tests/bench/test_kernels.py tests/gpu/test_gpu_train.py; do
  b=$(basename $f .py)
  timeout $(( $(left) - 5 )) python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rfEs --tb=short $f > $OUT/$b.log 2>&1
  echo "$b rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/$b.log | head -12; stage $b
done
