#!/bin/bash
# call 2: the real SmolLM2 (GGUF -> HF folder); GPU tests (background); target-written prompts and the
# target's greedy answers; the answers back (compressed); the tokenized cache and a warm compile of the
# recipe; then the step-time variants on the real data (2,000 answers, two epochs + 15 steps each).
set -u
source .gpu/s/env.sh
trap 'cp $K/gpu-tests.log $OUT/ 2>/dev/null; (cd $K && tar czf $OUT/c2.tgz --ignore-failed-read data/*.log data/inspect.txt warm.log v/*/res.json v/*/log v/*/prof-*.txt gguf.sha256 data.sha256 mode.txt 2>/dev/null)' EXIT
cat $K/m/part_aa .gpu/b/part_ab > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf && sha256sum $K/m/*.gguf | tee $K/gguf.sha256
$PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" > $K/convert.log 2>&1 || { tail $K/convert.log; exit 1; }
ln -sfn $K/smollm2 assets/smollm2
stage "model ready"
timeout 240 $PY -m pytest -m gpu -v -p no:cacheprovider -rs --tb=short tests/gpu/test_gpu_train.py \
  -k "cuda_graph or compiled_loss or flex_forward" > $K/gpu-tests.log 2>&1 &
mkdir -p $D && cp -n .gpu/s/seeds.jsonl $D/
DEVICE=$DEV OUT=$D NGPU=1 NUM_SYNTH=${SYNTH:-70000} SYNTH_SECONDS=${SYNTH_S:-75} REGEN_SECONDS=${REGEN_S:-190} MAX_NEW=256 \
  GEN_BATCH=2048 DFT="$DFT" PY=$PY bash src/dflash_train/recipes/smollm2/data.sh > $D/data.log 2>&1
stage "data: $(wc -l < $D/synth.jsonl) synthetic prompts, $(cat $D/greedy-*.jsonl | wc -l) greedy answers"
set_common
( cd $D && tar cf - greedy-*.jsonl | xz -T4 -6 > /tmp/data.tar.xz && split -b 15M -d /tmp/data.tar.xz $OUT/data-xz.part && sha256sum /tmp/data.tar.xz > $K/data.sha256 ) &
timeout $(( $(left) - 150 )) $DFT train $COMMON train.run_dir=$K/warm train.max_steps=2 train.time_budget_minutes=0 > $K/warm.log 2>&1
grep -h -i "trim\|skip\|kept\|steps/epoch\|padding\|first step" $K/warm.log | head -12 | tee $D/inspect.txt
stage "tokenized, recipe compiled"
tail -4 $K/gpu-tests.log
G=$(ls $D/greedy-*.jsonl | head -1)
for v in default:train.compile_mode=default reduce:train.compile_mode=reduce-overhead; do
  n=${v%%:*}; ov=${v#*:}; mkdir -p $K/v/$n
  [ $(left) -lt 60 ] && { echo "no time for $n"; break; }
  timeout $(( $(left) - 8 )) $PY .gpu/s/prof.py assets/smollm2 $G $K/v/$n data.max_examples=2000 data.cache_dir=$K/cache \
    train.feature_cache=device data.trim_loops=true $ov > $K/v/$n/log 2>&1
  tail -1 $K/v/$n/log
  stage "variant $n"
done
$PY - <<'PY' | tee $K/mode.txt
import json
r = {}
for n in ("default", "reduce"):
    try:
        r[n] = json.load(open(f"/root/keep/v/{n}/res.json"))
    except OSError:
        pass
ok = "reduce" in r and "default" in r and r["reduce"]["ms_cached_steps"] and r["reduce"]["last_loss"] and \
    abs(r["reduce"]["last_loss"] - r["default"]["last_loss"]) < 0.05 * r["default"]["last_loss"] and \
    r["reduce"]["ms_cached_steps"] < 0.9 * r["default"]["ms_cached_steps"]
print("reduce-overhead" if ok else "default")
PY
wait
ls -la $OUT
