#!/usr/bin/env bash
# call 3: issue 38's benches (the REF line; bf16, compiled target, FP8 + compiled target; the MoE shape) and the
# GPU tests of target.compile
source .gpu/s/env.sh
[ -f $K/smollm2/config.json ] && { rm -rf assets/smollm2; ln -s $K/smollm2 assets/smollm2; }
[ -e assets/smollm2 ] || ln -s $PWD/.gpu/tok assets/smollm2  # the training test needs only the tokenizer
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; stage start
REF="--drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --batch-size 1 --steps 8 --warmup 2 --attention flex --compile --device cuda"
V=("bf16:qwen3-8b:" "fp8-ct:qwen3-8b:--target-fp8 --compile-target" "bf16-ct:qwen3-8b:--compile-target" "moe-ct:qwen3-30b-a3b:--compile-target")
for v in "${V[@]}"; do
  name=${v%%:*}; rest=${v#*:}; tc=${rest%%:*}; flags=${rest#*:}
  [ -s $K/b/ref-$name.json ] && continue
  mkdir -p $K/b
  timeout $(( $(left) - 100 )) $DFT bench --target-config $tc $REF $flags --out $K/b/ref-$name.json > $K/b/ref-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "import json;d=json.load(open('$K/b/ref-$name.json'));print(round(d['context_tokens_per_s']), round(d['mfu'],3), d['peak_memory_gib'], d['first_step_s'], d['phase_seconds'])" 2>&1 | tail -1)"
  stage $name
done
timeout $(( $(left) - 10 )) python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_target_compile.py 2>&1 | tail -15 > $K/b/gpu-tests.log
cat $K/b/gpu-tests.log; stage tests
(cd $K && tar czf $OUT/b.tgz b)
for v in "moe:qwen3-30b-a3b:"; do name=moe; [ $(left) -gt 120 ] || break
  timeout $(( $(left) - 15 )) $DFT bench --target-config qwen3-30b-a3b $REF --out $K/b/ref-$name.json > $K/b/ref-$name.log 2>&1; echo "moe rc=$?"; stage moe
done
(cd $K && tar czf $OUT/b.tgz b)
