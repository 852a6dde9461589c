#!/usr/bin/env bash
# session 2026-12-04b call 6: REF FP8 + compiled target again (the margin over 16,000), the same with --cuda-graph-step
# (--kernels 12), and the idle gaps of the graphed timed loop
source .gpu/s/env.sh
stage start
REF="--target-config qwen3-8b --drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --batch-size 1 --steps 16 --warmup 2 --attention flex --compile --device cuda"
for v in "fp8-ct-b:--target-fp8 --compile-target" "fp8-ct-graph:--target-fp8 --compile-target --cuda-graph-step --kernels 12"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 110 $DFT bench $REF $flags --out $OUT/ref-$name.json > $OUT/ref-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "import json;d=json.load(open('$OUT/ref-$name.json'));print(round(d['context_tokens_per_s']), round(d['mfu'],3), d['peak_memory_gib'], d['first_step_s'], d['phase_seconds'])" 2>&1 | tail -1)"
  stage $name
done
timeout $(( $(left) - 3 )) python3 .gpu/s/gaps.py fp8 graph > $OUT/gaps-graph.json 2> $OUT/gaps-graph.err; echo "gaps rc=$?"; head -9 $OUT/gaps-graph.json; tail -2 $OUT/gaps-graph.err; stage gaps
