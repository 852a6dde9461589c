#!/bin/bash
# call 2: the real SmolLM2 (GGUF -> HF folder), target-written prompts + the target's greedy answers
# (one GPU), then (at once) the tokenized cache and the GPU tests; the answers come back compressed
# (data-*.part) so a later session can carry them instead of regenerating. All under $K.
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read data/*.log data/inspect.txt abl/warm*.log gpu-tests.log gguf.sha256 data.sha256 2>/dev/null)' EXIT
if [ ! -f $K/smollm2/config.json ]; then
  cat $K/m/part_aa .gpu/b/part_ab > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf && sha256sum $K/m/*.gguf | tee $K/gguf.sha256
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/b/gguf-*.whl
  $PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" || exit 1
  ln -sfn $K/smollm2 assets/smollm2
fi
stage "model ready"
mkdir -p $D && cp -n .gpu/s/seeds.jsonl $D/
REGEN_S=$(( $(left) - ${SYNTH_S:-95} - ${CACHE_S:-75} ))
echo "regeneration cap: $REGEN_S s"
DEVICE=$DEV OUT=$D NGPU=1 NUM_SYNTH=${SYNTH:-70000} SYNTH_SECONDS=${SYNTH_S:-95} REGEN_SECONDS=$REGEN_S MAX_NEW=${MAX_NEW:-256} \
  GEN_BATCH=${GEN_BATCH:-2048} DFT="$DFT" PY=$PY bash src/dflash_train/recipes/smollm2/data.sh > $D/data.log 2>&1
stage "data: $(wc -l < $D/seeds.jsonl) seeds, $(wc -l < $D/synth.jsonl) synthetic prompts, $(cat $D/greedy-*.jsonl | wc -l) greedy answers"
set_common
mkdir -p $K/abl
W=$(( $(left) - 5 ))
# the GPU tests (real SmolLM2 where they need it) beside the tokenization, which is CPU work
if [ "$DEV" = cuda ]; then
  timeout $(( W - 10 )) $PY -m pytest -m gpu tests/gpu -v -p no:cacheprovider -rs --durations=10 > $K/gpu-tests.log 2>&1 &
  TESTS=$!
fi
env $(gpu 0) timeout $W $DFT train $COMMON train.run_dir=$K/abl/warm train.max_steps=2 train.time_budget_minutes=0 > $K/abl/warm.log 2>&1 &
env $(gpu 0) timeout $W $DFT train $COMMON train.run_dir=$K/abl/warm-trim train.max_steps=2 train.time_budget_minutes=0 data.trim_loops=true > $K/abl/warm-trim.log 2>&1 &
# the answers, compressed, in parts under the 16 MiB a returned file may have
command -v xz >/dev/null && Z="xz -T8 -6" || Z="gzip -6"
( cd $D && tar cf - greedy-*.jsonl | $Z > /tmp/data.tar.z && split -b 15M -d /tmp/data.tar.z $OUT/data-$(echo $Z | cut -c1-2).part && sha256sum /tmp/data.tar.z > $K/data.sha256 ) &
wait
grep -h -i "trim\|skip\|examples\|padding\|first step" $K/abl/warm.log $K/abl/warm-trim.log | head -20 > $D/inspect.txt
cat $D/inspect.txt
tail -5 $K/gpu-tests.log 2>/dev/null
ls -la $OUT
stage "caches warm, gpu tests, data packed"
