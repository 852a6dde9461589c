#!/bin/bash
# call 3: the target's fp32 continuations of the 40 held-out prompts (for replay); the curve runs
# (0.5 / 1 / 2 GPU-minutes of steps) and three ablations at the 1-minute step count, four at a time
# on the GPU with fixed step counts (train.max_steps: the LR schedule completes in each), each
# replayed on the held-out prompts as soon as it ends; the batched replay checked against the
# step-by-step one; the decoder's step times with and without a compiled draft step.
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c3.tgz --ignore-failed-read runs/*/train.log runs/*/eval.json runs/*/replay.log runs/*/summary.json runs/*/metrics.jsonl runs/*/export.log runs/list.txt runs/batched/* refs.log steps-*.json steps-*.log 2>/dev/null)' EXIT
S1=${S1:-360}   # steps per GPU-minute, about: 2,153 steps in 5.5 minutes alone on the H200 last session
SLOTS=${SLOTS:-4}
mkdir -p $K/runs
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
  $PY -m dflash_train.eval.replay --target assets/smollm2 --drafter /tmp/rdrafter --prompts $HELD --limit $RL \
    --max-new-tokens $RT --dtype float32 --device $DEV --references $K/refs.json --only-references --out /tmp/rrand ) > $K/refs.log 2>&1 &
REFS=$!
# name|steps|overrides (longest first, so the queue ends together)
cat > $K/runs/list.txt <<LIST
m2|$((2 * S1))|
depth8|$S1|drafter.num_hidden_layers=8
base|$S1|
gamma7|$S1|train.gamma=7
trim-loops|$S1|data.trim_loops=true
m05|$((S1 / 2))|
LIST
job() {  # name steps overrides: train, then replay the exported drafter
  local d=$K/runs/$1
  mkdir -p $d
  env $(gpu 0) timeout --signal=TERM $(( $(left) - 75 )) $DFT train $COMMON train.run_dir=$d/run train.time_budget_minutes=0 \
    train.max_steps=$2 train.log_every=25 $3 > $d/train.log 2>&1
  cp $d/run/metrics.jsonl $d/run/summary.json $d/ 2>/dev/null
  echo "trained $1 ($2 steps): $(tail -1 $d/train.log)"
  while [ ! -s $K/refs.json ] && kill -0 $REFS 2>/dev/null; do sleep 2; done
  timeout $(( $(left) - 40 )) bash .gpu/s/replayrun.sh $d/run $d
}
PIDS=()
running() { local n=0 p; for p in "${PIDS[@]}"; do kill -0 $p 2>/dev/null && n=$((n + 1)); done; echo $n; }
while IFS='|' read -r name steps ov; do
  while [ $(running) -ge $SLOTS ]; do sleep 2; done
  job "$name" "$steps" "$ov" &
  PIDS+=($!)
done < $K/runs/list.txt
wait
stage "curve + ablations trained and replayed"
for n in $(cut -d'|' -f1 $K/runs/list.txt); do echo "$n $(grep -o 'mean tau [0-9.]*' $K/runs/$n/replay.log 2>/dev/null)"; done | tee $OUT/taus.txt
# the batched replay (one drafter forward per prompt) against the step-by-step one, same drafter
mkdir -p $K/runs/batched
timeout $(( $(left) - 30 )) $PY -m dflash_train.eval.replay --target assets/smollm2 --drafter $K/runs/m2/drafter --prompts $HELD \
  --limit $RL --max-new-tokens $RT --dtype float32 --device $DEV --references $K/refs.json --batched --out $K/runs/batched \
  > $K/runs/batched/replay.log 2>&1
$PY - $K/runs/m2/eval.json $K/runs/batched/eval.json <<'PY' | tee $K/runs/batched/check.txt
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
la = [p["acceptance_lengths"] for p in a["prompts"]]
lb = [p["acceptance_lengths"] for p in b["prompts"]]
same = sum(x == y for x, y in zip(la, lb))
print(f"batched vs step-by-step: {same}/{len(la)} prompts with identical acceptance lengths; tau {b['mean_tau']:.4f} vs {a['mean_tau']:.4f}")
PY
stage "batched replay checked"
# step times of the decoder on a trained drafter: the draft step compiled alone or not
for dt in bfloat16 float32; do
  [ $(left) -lt 50 ] && break
  v=$([ $dt = float32 ] && echo cudagraph-fused-splitk,compile-draft+cudagraph-fused-splitk || echo cudagraph-fused,compile-draft+cudagraph-fused)
  timeout $(( $(left) - 10 )) $PY -m dflash_train.decoding.bench_steps --target assets/smollm2 --drafter $K/runs/base/drafter \
    --dtype $dt --device $DEV --variants $v --time-budget-s $(( $(left) - 45 )) --out $K/steps-$dt.json > $K/steps-$dt.log 2>&1
  stage "step times $dt"
done
