#!/usr/bin/env bash
# call 4: the two GPU tests of target.compile that failed in call 3 (one lacked the datasets wheel), in full;
# the FP8 + compiled-target REF bench again over 16 steps; the MoE shape with FP8 + compiled target
source .gpu/s/env.sh
[ -e assets/smollm2 ] || ln -s $PWD/.gpu/tok assets/smollm2
stage start
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA --tb=long tests/gpu/test_gpu_target_compile.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -70 > $OUT/gpu-tests.log
cat $OUT/gpu-tests.log | tail -40; stage tests
REF="--drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --batch-size 1 --warmup 2 --attention flex --compile --device cuda"
for v in "fp8-ct-16:qwen3-8b:--steps 16 --target-fp8 --compile-target" "moe-fp8-ct:qwen3-30b-a3b:--steps 8 --target-fp8 --compile-target"; do
  name=${v%%:*}; rest=${v#*:}; tc=${rest%%:*}; flags=${rest#*:}
  [ $(left) -gt 90 ] || break
  timeout $(( $(left) - 20 )) $DFT bench --target-config $tc $REF $flags --out $OUT/ref-$name.json > $OUT/ref-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "import json;d=json.load(open('$OUT/ref-$name.json'));print(round(d['context_tokens_per_s']), round(d['mfu'],3), d['peak_memory_gib'], d['first_step_s'], d['phase_seconds'])" 2>&1 | tail -1)"
  stage $name
done
