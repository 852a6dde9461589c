#!/bin/bash
# call 3: the target's fp32 continuations of the 40 held-out prompts (for replay), six equal-step
# ablations (three at a time), their replayed tau, the selection, then the tau-vs-compute runs with
# the selection (0.5 / 1 / 2 minutes alone on the GPU, each replayed while the next trains).
set -u
source .gpu/s/env.sh
trap '(cd $K && tar czf $OUT/c3.tgz --ignore-failed-read abl/*/train.log abl/*/eval.json abl/*/replay.log abl/*/summary.json abl/*/metrics.jsonl abl/selection.txt abl/compare.md abl/compare.json abl/list.txt curve/*/train.log curve/*/eval.json curve/*/replay.log curve/*/summary.json curve/*/metrics.jsonl refs.log 2>/dev/null); cp $OUT/stages.log $OUT/stages-c3.log 2>/dev/null' EXIT
S=${ABL_STEPS:-250}
mkdir -p $K/abl $K/curve
# continuations: made once by a replay of a random drafter in the recipe's shape
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
cat > $K/abl/list.txt <<LIST
base|
lr1.5e-3|optim.lr=1.5e-3
gamma4|train.gamma=4
trim-loops|data.trim_loops=true
init-target|train.drafter_init=target
distill0.5|train.distill=0.5
LIST
train_abl() {  # name overrides
  mkdir -p $K/abl/$1
  env $(gpu 0) timeout --signal=TERM $(( $(left) - 60 )) $DFT train $COMMON train.run_dir=$K/abl/$1/run train.time_budget_minutes=0 \
    train.max_steps=$S train.log_every=25 $2 > $K/abl/$1/train.log 2>&1
  cp $K/abl/$1/run/metrics.jsonl $K/abl/$1/run/summary.json $K/abl/$1/ 2>/dev/null
}
replay_abl() {  # the continuations first (made by the job started above)
  while [ ! -s $K/refs.json ] && kill -0 $REFS 2>/dev/null; do sleep 2; done
  bash .gpu/s/replayrun.sh $K/abl/$1/run $K/abl/$1
}
round() {  # the given lines of list.txt trained at once, then replayed one by one in the background
  local names=() pids=()
  while IFS='|' read -r name ov; do train_abl "$name" "$ov" & pids+=($!); names+=("$name"); done < <(sed -n "$1" $K/abl/list.txt)
  wait "${pids[@]}"
  ( for n in "${names[@]}"; do replay_abl $n; done ) > $K/abl/replay-$2.log 2>&1 &
  RP=$!
}
round 1,3p a; stage "ablations 1-3 trained"
RPA=$RP
round 4,6p b; stage "ablations 4-6 trained"
wait $RPA $RP; cat $K/abl/replay-a.log $K/abl/replay-b.log
stage "ablations replayed"
$PY .gpu/s/select.py $K/abl | tee $OUT/selection.log
SEL=$(cat $K/abl/selection.txt)
stage "selection: $SEL"
train_curve() {  # name minutes: skipped when the call has no time left for it
  local min=$(python3 -c "print($2*${CS:-1})") need=$(python3 -c "print(int($2*${CS:-1}*60+45))")
  if [ $(left) -lt $need ]; then echo "skip curve run $1: $(left) s left, needs $need"; return 1; fi
  mkdir -p $K/curve/$1
  env $(gpu 0) timeout --signal=TERM $(( $(left) - 20 )) $DFT train $COMMON $SEL train.run_dir=$K/curve/$1/run \
    train.time_budget_minutes=$min train.log_every=25 > $K/curve/$1/train.log 2>&1
  cp $K/curve/$1/run/summary.json $K/curve/$1/run/metrics.jsonl $K/curve/$1/ 2>/dev/null
}
# each alone on the GPU (a replay beside a time-budgeted run would take steps from it); replays at the end
for spec in m05:0.5 m1:1 m2:2; do
  n=${spec%%:*}; m=${spec##*:}
  train_curve $n $m
  stage "curve $n"
done
for n in m05 m1 m2; do [ -d $K/curve/$n/run ] && bash .gpu/s/replayrun.sh $K/curve/$n/run $K/curve/$n & done
wait
stage "curve runs replayed"
