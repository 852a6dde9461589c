#!/usr/bin/env bash
# Data-size scaling: the same drafter and time budget trained on nested random subsets of the
# answers (data.max_examples), one run per GPU at a time; prints held-out tau per size.
# Usage: SIZES="8000 16000 32000" GPUS="0 1" TIME_BUDGET=4 bash src/dflash_train/recipes/smollm2/scaling.sh
set -euo pipefail
DATA=${DATA:-runs/smollm2/data}
OUT=${OUT:-runs/smollm2/scaling}
SIZES=${SIZES:-"8000 16000 32000"}
GPUS=${GPUS:-0}
TIME_BUDGET=${TIME_BUDGET:-4}
DFT=${DFT:-dflash-train}
PY=${PY:-python}
PATHS=$(ls "$DATA"/greedy-*.jsonl | paste -sd, -)
read -r -a gpus <<< "$GPUS"
mkdir -p "$OUT"
i=0
for n in $SIZES; do
  gpu=${gpus[$((i % ${#gpus[@]}))]}
  CUDA_VISIBLE_DEVICES=$gpu $DFT train smollm2-1gpu "data.paths=[$PATHS]" "data.max_examples=$n" \
    "train.run_dir=$OUT/n$n" "train.time_budget_minutes=$TIME_BUDGET" eval.every_minutes=0 \
    eval.num_prompts=16 eval.max_new_tokens=128 "data.cache_dir=$OUT/cache-$gpu" "$@" > "$OUT/n$n.log" 2>&1 &
  i=$((i + 1))
  if (( i % ${#gpus[@]} == 0 )); then wait; fi
done
wait
$PY - "$OUT" $SIZES <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'examples':>9} {'steps':>6} {'epochs':>7} {'held-out tau':>13} {'train exp. acc.':>16}")
for n in sys.argv[2:]:
    f = out / f"n{n}" / "summary.json"
    if not f.exists():
        print(f"{n:>9} (no summary: see {out}/n{n}.log)")
        continue
    s = json.loads(f.read_text())
    rows = [json.loads(x) for x in (out / f"n{n}" / "metrics.jsonl").read_text().splitlines()]
    epoch = max((r.get("epoch", 0) for r in rows), default=0)
    print(f"{n:>9} {s['steps']:>6} {epoch:>7} {s.get('tau_after', float('nan')):>13.3f} "
          f"{s.get('last_expected_acceptance', float('nan')):>16.3f}")
PYEOF
