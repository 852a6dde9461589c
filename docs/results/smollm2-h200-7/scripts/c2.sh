#!/bin/bash
# call 2: the real SmolLM2 (GGUF -> HF folder); the committed greedy answers; tokenized cache and a warm
# compile of the recipe (graphed step); a short real-data run for step times with the graph on
set -u
source .gpu/s/env.sh
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 && touch /tmp/site/.done; }
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read warm.log short/train.log short/metrics.jsonl gguf.sha256 2>/dev/null)' EXIT
[ -f .gpu/b/part_ab ] && cat $K/m/part_aa .gpu/b/part_ab .gpu/b/part_ac > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf; sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ln -sfn $K/smollm2 assets/smollm2
stage "model ready"
mkdir -p $D && tar xJf docs/results/smollm2-h200-6/data/greedy-answers.tar.xz -C $D && wc -l $D/greedy-0.jsonl
set_common
timeout $(( $(left) - 100 )) $DFT train $COMMON train.run_dir=$K/warm train.max_steps=3 train.time_budget_minutes=0 > $K/warm.log 2>&1
grep -h -i "trim\|skip\|kept\|steps/epoch\|padding\|first step\|cuda_graph\|capture" $K/warm.log | head -12
stage "tokenized, recipe compiled"
mkdir -p $K/short
timeout $(( $(left) - 5 )) $DFT train $COMMON train.run_dir=$K/short/run train.time_budget_minutes=${SHORT_MIN:-0.5} \
  train.log_every=100 ${SHORT_EXTRA:-} > $K/short/train.log 2>&1
cp $K/short/run/metrics.jsonl $K/short/ 2>/dev/null
grep -E "^step|time budget|capture|cuda_graph" $K/short/train.log | tail -6
stage "short run"
