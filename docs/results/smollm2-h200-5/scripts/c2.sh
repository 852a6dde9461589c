#!/bin/bash
# call 2: the real SmolLM2 (GGUF -> HF folder), target-written prompts + the target's greedy answers,
# then (at once) the tokenized cache, the held-out references for replay and the GPU tests that did
# not finish last session; then the compile cache of each call-3 variant's shapes (2 steps each).
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read data/*.log data/inspect.txt abl/*.log gpu-tests.log refs.log gguf.sha256 data.sha256 2>/dev/null); cp $K/gpu-tests.log $OUT/ 2>/dev/null' EXIT
if [ ! -f $K/smollm2/config.json ]; then
  cat $K/m/part_aa .gpu/b/part_ab > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf && sha256sum $K/m/*.gguf | tee $K/gguf.sha256
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/b/gguf-*.whl
  $PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" || exit 1
  ln -sfn $K/smollm2 assets/smollm2
fi
stage "model ready"
mkdir -p $D && cp -n .gpu/s/seeds.jsonl $D/
REGEN_S=$(( $(left) - ${SYNTH_S:-75} - ${CACHE_S:-150} ))
echo "regeneration cap: $REGEN_S s"
DEVICE=$DEV OUT=$D NGPU=1 NUM_SYNTH=${SYNTH:-70000} SYNTH_SECONDS=${SYNTH_S:-75} REGEN_SECONDS=$REGEN_S MAX_NEW=${MAX_NEW:-256} \
  GEN_BATCH=${GEN_BATCH:-2048} DFT="$DFT" PY=$PY bash src/dflash_train/recipes/smollm2/data.sh > $D/data.log 2>&1
stage "data: $(wc -l < $D/seeds.jsonl) seeds, $(wc -l < $D/synth.jsonl) synthetic prompts, $(cat $D/greedy-*.jsonl | wc -l) greedy answers"
set_common
mkdir -p $K/abl
W=$(( $(left) - 5 ))
if [ "$DEV" = cuda ]; then
  timeout $(( W - 10 )) $PY -m pytest -m gpu -v -p no:cacheprovider -rs --durations=10 --tb=long \
    "tests/gpu/test_gpu_static.py::test_cuda_graph_decoding_equals_reference[compile+fused]" \
    tests/gpu/test_gpu_static.py::test_compiled_graphs_on_smollm2_equal_reference tests/gpu/test_gpu_train.py \
    > $K/gpu-tests.log 2>&1 &
fi
# the held-out prompts' fp32 greedy continuations, once, for every replay of call 3
( $PY - <<'PY'
import torch
from dflash_train.models.target import Target
from dflash_train.models.config import DrafterConfig, resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.export.serving import export_drafter
t = Target.load("assets/smollm2", dtype=torch.float32, device="cpu")
c = resolve_drafter_config(DrafterConfig(num_hidden_layers=4, block_size=16), t.facts, mask_token_id=3)
export_drafter(DFlashDrafter(c), c, "/tmp/rdrafter", tokenizer=t.tokenizer, force=True)
PY
  timeout $W $PY -m dflash_train.eval.replay --target assets/smollm2 --drafter /tmp/rdrafter --prompts $HELD --limit $RL \
    --max-new-tokens $RT --dtype float32 --device $DEV --references $K/refs.json --only-references --out /tmp/rrand ) > $K/refs.log 2>&1 &
# the answers, compressed, in parts under the 16 MiB a returned file may have
command -v xz >/dev/null && Z="xz -T4 -6" || Z="gzip -6"
( cd $D && tar cf - greedy-*.jsonl | $Z > /tmp/data.tar.z && split -b 15M -d /tmp/data.tar.z $OUT/data-$(echo $Z | cut -c1-2).part && sha256sum /tmp/data.tar.z > $K/data.sha256 ) &
# the tokenized cache (the recipe: loops trimmed) and the base compile
env $(gpu 0) timeout $W $DFT train $COMMON train.run_dir=$K/abl/warm train.max_steps=2 train.time_budget_minutes=0 > $K/abl/warm.log 2>&1
stage "tokenized, base compiled"
# compile caches of the call-3 variants' shapes (the tokenized cache is shared now)
while IFS='|' read -r name ov; do
  [ "$name" = base ] && continue
  [ -n "$ov" ] || continue
  env $(gpu 0) timeout $(( $(left) - 5 )) $DFT train $COMMON train.run_dir=$K/abl/warm-$name train.max_steps=2 \
    train.time_budget_minutes=0 $ov > $K/abl/warm-$name.log 2>&1 &
done < ${VARIANTS:-.gpu/s/variants.txt}
wait
grep -h -i "trim\|skip\|examples\|padding\|first step" $K/abl/warm.log | head -20 > $D/inspect.txt
cat $D/inspect.txt; grep -h "first step" $K/abl/warm-*.log
tail -15 $K/gpu-tests.log 2>/dev/null; tail -2 $K/refs.log
ls -la $OUT
stage "caches warm, gpu tests, refs, data packed"
