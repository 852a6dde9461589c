#!/bin/bash
# call 2: the real SmolLM2 (GGUF -> HF folder); the committed answers (set 1); a SECOND set of new prompts
# SmolLM2 writes (SEED=1, none of set 1's) and its greedy answers, for as long as the call allows; set 2
# comes back compressed (to commit); both sets tokenized and the recipe compiled (3 steps)
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read warm.log data2/data.log data2/regen-0.log gguf.sha256 2>/dev/null)' EXIT
cat $K/m/part_aa .gpu/b/part_ab .gpu/b/part_ac > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ln -sfn $K/smollm2 assets/smollm2
stage "model ready"
mkdir -p $D $K/data2
tar xJf docs/results/smollm2-h200-6/data/greedy-answers.tar.xz -C $D && wc -l $D/greedy-0.jsonl
SYNTH_S=${SYNTH_S:-140}
REGEN_S=$(( $(left) - SYNTH_S - ${WARM_S:-125} ))
echo "prompts for ${SYNTH_S}s, answers for ${REGEN_S}s"
DEVICE=$DEV OUT=$K/data2 NGPU=1 SEED=1 SEED_PROMPTS=0 EXCLUDE=$D/greedy-0.jsonl NUM_SYNTH=${SYNTH:-200000} \
  SYNTH_SECONDS=$SYNTH_S REGEN_SECONDS=$REGEN_S MAX_NEW=256 GEN_BATCH=${GEN_BATCH:-2048} DFT="$DFT" PY=$PY \
  bash src/dflash_train/recipes/smollm2/data.sh > $K/data2/data.log 2>&1
grep "==" $K/data2/data.log
ln -sfn $K/data2/greedy-0.jsonl $D/greedy-1.jsonl  # set_common trains on every $D/greedy-*.jsonl
stage "set 2: $(wc -l < $K/data2/synth.jsonl) prompts, $(wc -l < $K/data2/greedy-0.jsonl) greedy answers"
( cd $K/data2 && tar cf - greedy-0.jsonl | xz -T8 -6 > /tmp/data2.tar.xz && split -b 15M -d /tmp/data2.tar.xz $OUT/data2-xz.part \
  && sha256sum /tmp/data2.tar.xz > $OUT/data2.sha256 ) &
set_common
timeout $(( $(left) - 8 )) $DFT train $COMMON train.run_dir=$K/warm train.max_steps=3 train.time_budget_minutes=0 \
  > $K/warm.log 2>&1
grep -h -i "read\|trim\|kept\|steps/epoch\|feature cache\|first step\|cuda_graph" $K/warm.log | head -12
stage "tokenized, recipe compiled"
wait
