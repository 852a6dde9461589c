"""The ablation table from the runs' own first-epoch metrics (the replays of these runs failed).

Every ablation ran 250 optimizer steps (equal steps and tokens; three at a time on one H200,
so tokens/s are shared) over data of 470 packed steps per epoch (352 with trimmed loops):
no batch had been seen before it was measured, so the metrics of steps 200-250 are a
held-out measurement on the training distribution. Expected acceptance and per-position
accuracy do not depend on the loss weights (gamma) or on distillation; the loop-trimmed run
is measured on different (trimmed) data and is not comparable.

    python docs/results/smollm2-h200-3/scripts/ablation_table.py docs/results/smollm2-h200-3/abl
"""
import json
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1])
names = [line.split("|")[0] for line in (root / "list.txt").read_text().splitlines() if line.strip()]
rows = {}
for name in names:
    records = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    records = [r for r in records if "expected_acceptance" in r]
    window = [r for r in records if r["step"] >= 200]
    # per-log standard error of the mean over the window (each log is one batch of ~4K blocks)
    ea = [r["expected_acceptance"] for r in window]
    rows[name] = {
        "steps": [r["step"] for r in window],
        "expected_acceptance": statistics.mean(ea),
        "expected_acceptance_spread": max(ea) - min(ea),
        "accuracy_pos1_4": [statistics.mean(r["accuracy"][k] for r in window) for k in range(4)],
        "loss": statistics.mean(r["loss"] for r in window),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records[1:]),
    }
base = rows["base"]["expected_acceptance"]
print("| change | expected acceptance (steps 200-250) | vs base | accuracy pos 1 / 2 / 3 / 4 | loss | tokens/s (3 runs share the GPU) |")
print("|---|---|---|---|---|---|")
for name, r in rows.items():
    acc = " / ".join(f"{a:.3f}" for a in r["accuracy_pos1_4"])
    print(f"| {name} | {r['expected_acceptance']:.3f} (spread {r['expected_acceptance_spread']:.3f}) | "
          f"{r['expected_acceptance'] - base:+.3f} | {acc} | {r['loss']:.3f} | {r['tokens_per_s']:,.0f} |")
(root / "ablations.json").write_text(json.dumps(rows, indent=1))
