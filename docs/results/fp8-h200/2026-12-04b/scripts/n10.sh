#!/usr/bin/env bash
# session 2026-12-04b call 5: host tensors pinned before their async copies: REF FP8 + compiled target, the bf16 rows
# from the same line; the Muon graph test in full; the kernels test; test_gpu_train (with the no-wait copy test);
# the idle gaps of the timed loop
source .gpu/s/env.sh
[ -e assets/smollm2 ] || ln -s $PWD/.gpu/tok assets/smollm2
stage start
REF="--target-config qwen3-8b --drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --batch-size 1 --steps 16 --warmup 2 --attention flex --compile --device cuda"
for v in "fp8-ct:--target-fp8 --compile-target" "bf16:" "bf16-ct:--compile-target"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 150 $DFT bench $REF $flags --out $OUT/ref-$name.json > $OUT/ref-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "import json;d=json.load(open('$OUT/ref-$name.json'));print(round(d['context_tokens_per_s']), round(d['mfu'],3), d['peak_memory_gib'], d['first_step_s'], d['phase_seconds'])" 2>&1 | tail -1)"
  tail -2 $OUT/ref-$name.log | grep -i error
  stage $name
done
tar czf $OUT/ref-logs.tgz -C $OUT ref-fp8-ct.log ref-bf16.log ref-bf16-ct.log && rm $OUT/ref-*.log
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rfEs --tb=long tests/gpu/test_gpu_train.py -k "packed-muon" > $OUT/muon.log 2>&1
echo "muon rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/muon.log | head -5; grep -n "dflash_train/.*py:[0-9]\|^E " $OUT/muon.log | head -30; stage muon
timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rfEs --tb=short tests/bench/test_kernels.py > $OUT/test_kernels.log 2>&1
echo "test_kernels rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/test_kernels.log | head -8; stage test_kernels
timeout $(( $(left) - 70 )) python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rfEs --tb=short tests/gpu/test_gpu_train.py -k "not packed-muon" > $OUT/gpu_train.log 2>&1
echo "gpu_train rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/gpu_train.log | head -12; stage gpu_train
timeout $(( $(left) - 3 )) python3 .gpu/s/gaps.py fp8 > $OUT/gaps.json 2> $OUT/gaps.err; echo "gaps rc=$?"; head -8 $OUT/gaps.json; tail -2 $OUT/gaps.err; stage gaps
cd $OUT && tar czf logs.tgz muon.log test_kernels.log gpu_train.log gaps.err stages.log && rm muon.log test_kernels.log gpu_train.log gaps.err stages.log; ls $OUT
