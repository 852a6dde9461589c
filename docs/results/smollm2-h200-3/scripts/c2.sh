#!/bin/bash
# call 2: the real SmolLM2 (GGUF -> HF folder), target-written prompts + the target's greedy answers
# (one GPU), then the tokenized caches (plain and loop-trimmed) and the compile cache. All under $K.
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read data/*.log data/inspect.txt abl/warm*.log 2>/dev/null); cp $OUT/stages.log $OUT/stages-c2.log 2>/dev/null' EXIT
if [ ! -f $K/smollm2/config.json ]; then
  cat $K/m/part_aa .gpu/b/part_ab > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf && sha256sum $K/m/*.gguf | tee $OUT/gguf.sha256
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/b/gguf-*.whl
  $PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" || exit 1
  ln -sfn $K/smollm2 assets/smollm2
fi
stage "model ready"
mkdir -p $D && cp -n .gpu/s/seeds.jsonl $D/
REGEN_S=$(( $(left) - ${SYNTH_S:-95} - ${CACHE_S:-75} ))
echo "regeneration cap: $REGEN_S s"
DEVICE=$DEV OUT=$D NGPU=1 NUM_SYNTH=${SYNTH:-70000} SYNTH_SECONDS=${SYNTH_S:-95} REGEN_SECONDS=$REGEN_S MAX_NEW=${MAX_NEW:-256} \
  DFT="$DFT" PY=$PY bash src/dflash_train/recipes/smollm2/data.sh > $D/data.log 2>&1
stage "data: $(wc -l < $D/seeds.jsonl) seeds, $(wc -l < $D/synth.jsonl) synthetic prompts, $(cat $D/greedy-*.jsonl | wc -l) greedy answers"
set_common
mkdir -p $K/abl
W=$(( $(left) - 5 ))
env $(gpu 0) timeout $W $DFT train $COMMON train.run_dir=$K/abl/warm train.max_steps=2 train.time_budget_minutes=0 > $K/abl/warm.log 2>&1 &
env $(gpu 0) timeout $W $DFT train $COMMON train.run_dir=$K/abl/warm-trim train.max_steps=2 train.time_budget_minutes=0 data.trim_loops=true > $K/abl/warm-trim.log 2>&1 &
wait
grep -h -i "trim\|skip\|examples\|padding\|first step" $K/abl/warm.log $K/abl/warm-trim.log | head -20 > $D/inspect.txt
cat $D/inspect.txt
stage "caches warm"
