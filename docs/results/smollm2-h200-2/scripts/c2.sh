#!/bin/bash
# call 2: the real SmolLM2 (GGUF -> HF folder), prompts + greedy answers on both GPUs,
# then the equal-compute ablations (4 runs per GPU at once, fixed steps), their held-out
# evals and the selection for the main run. Everything kept under $K for the next calls.
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c2.tgz --ignore-failed-read abl/*.log abl/*/*.log abl/*/eval.json abl/*/metrics.jsonl abl/*/summary.json abl/selection.txt abl/compare.md abl/compare.json data/*.log data/inspect.txt 2>/dev/null); cp $OUT/stages.log $OUT/stages-c2.log 2>/dev/null' EXIT
NG=${NG:-2}  # GPUs on this machine
SYNTH=${SYNTH:-30000}; SYNTH_S=${SYNTH_S:-$((NG == 2 ? 45 : 35))}; REGEN_S=${REGEN_S:-$((NG == 2 ? 120 : 125))}
S=${ABL_STEPS:-$((NG == 2 ? 250 : 150))}
TRIM=${TRIM:-data.trim_loops=true}; INIT=${INIT:-train.drafter_init=target}

if [ ! -f $K/smollm2/config.json ]; then
  cat $K/m/part_aa .gpu/b/part_ab > $K/m/SmolLM2-135M-Instruct.Q4_1.gguf && sha256sum $K/m/*.gguf | tee $OUT/gguf.sha256
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/b/gguf-*.whl
  $PY -c "from pathlib import Path; from dflash_train.assets import convert_gguf_to_folder as c; c(Path('$K/m/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$K/smollm2'))" || exit 1
  ln -sfn $K/smollm2 assets/smollm2
fi
stage "model ready"

mkdir -p $D && cp -n .gpu/s/seeds.jsonl $D/
if [ ! -s $D/synth.jsonl ]; then
  for g in $(seq 0 $((NG - 1))); do
    env $(gpu $g) $PY -m dflash_train.recipes.prompts --target assets/smollm2 --out $D/synth-$g.jsonl --no-seeds \
      --num-synthetic $SYNTH --batch-size ${SYNTH_BATCH:-2048} --backend static --device $DEV --max-seconds $SYNTH_S --seed $g > $D/synth-$g.log 2>&1 &
  done
  wait
  $PY - "$D" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1]); seen = set(); n = 0
with open(d / "synth.jsonl", "w") as out:
    for f in sorted(d.glob("synth-*.jsonl")):
        for line in open(f):
            key = json.loads(line)["messages"][0]["content"].strip().lower()
            if key not in seen:
                seen.add(key); out.write(line); n += 1
print("synthetic prompts kept:", n)
PY
fi
stage "prompts: $(wc -l < $D/seeds.jsonl) seeds, $(wc -l < $D/synth.jsonl) synthetic"
DEVICE=$DEV OUT=$D NGPU=$NG REGEN_SECONDS=$REGEN_S DFT="$DFT" PY=$PY bash src/dflash_train/recipes/smollm2/data.sh > $D/data.log 2>&1
stage "greedy answers: $(cat $D/greedy-*.jsonl | wc -l)"
set_common

# warm-up: builds the tokenized caches (plain and trimmed) and the compile cache once
mkdir -p $K/abl
env $(gpu 0) timeout 150 $DFT train $COMMON train.run_dir=$K/abl/warm train.max_steps=2 train.time_budget_minutes=0 > $K/abl/warm.log 2>&1 &
env $(gpu $((NG - 1))) timeout 150 $DFT train $COMMON train.run_dir=$K/abl/warm-trim train.max_steps=2 train.time_budget_minutes=0 $TRIM > $K/abl/warm-trim.log 2>&1 &
wait
grep -h -i "trim\|skip\|examples\|padding" $K/abl/warm.log $K/abl/warm-trim.log | head -20 > $D/inspect.txt
stage "caches warm"

# name|gpu|overrides (equal compute: same tokens; anchors128 runs 0.6x the steps for its ~1.67x step cost)
G1=$((NG - 1))
if [ "$NG" = 2 ] && [ -z "${ABL_EXTRA:-}" ]; then
  ABL_EXTRA="lr1.2e-3|0|train.max_steps=$S optim.lr=1.2e-3
half-batch|1|train.max_steps=$((2 * S)) data.token_budget=16384
anchors128|1|train.max_steps=$((S * 6 / 10)) train.num_anchors=128"
fi
cat > $K/abl/list.txt <<LIST
base|0|train.max_steps=$S
lr2e-3|0|train.max_steps=$S optim.lr=2e-3
gamma4|0|train.max_steps=$S train.gamma=4
trim-loops|$G1|train.max_steps=$S $TRIM
init-target|$G1|train.max_steps=$S $INIT
${ABL_EXTRA:-}
LIST
sed -i '/^$/d' $K/abl/list.txt
ABL_T=$(( $(left) - 90 < ${ABL_TIMEOUT:-270} ? $(left) - 90 : ${ABL_TIMEOUT:-270} ))
echo "ablation runs: $(wc -l < $K/abl/list.txt), $S steps, timeout $ABL_T s"
while IFS='|' read -r name g ov; do
  ( mkdir -p $K/abl/$name
    env $(gpu $g) timeout --signal=TERM $ABL_T $DFT train $COMMON train.run_dir=$K/abl/$name/run train.time_budget_minutes=0 \
      train.log_every=25 $ov > $K/abl/$name/train.log 2>&1
    cp $K/abl/$name/run/metrics.jsonl $K/abl/$name/run/summary.json $K/abl/$name/ 2>/dev/null
  ) &
done < $K/abl/list.txt
wait
# evals one at a time, each with 90 s: five at once on one GPU did not finish in 150 s, and one
# alone did not finish in 50 s (40 prompts x 128 tokens, plus export, loading and warm-up)
while IFS='|' read -r name g ov; do
  env $(gpu $g) timeout 90 bash .gpu/s/evalrun.sh $K/abl/$name/run $K/abl/$name --no-baseline --no-compile
done < $K/abl/list.txt
stage "ablations trained and evaluated"
$PY .gpu/s/select.py $K/abl "$TRIM=trim-loops" "$INIT=init-target" | tee $OUT/selection.log
stage "selection: $(cat $K/abl/selection.txt)"
