"""The run-metric numbers the README and the closing note quote, from the kept metrics files.

    python docs/results/smollm2-h200-3/scripts/run_metrics.py docs/results/smollm2-h200-3
"""
import json
import statistics
import sys
from pathlib import Path


def records(path):
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if "expected_acceptance" in r]


root = Path(sys.argv[1])
main = records(root / "metrics-main.jsonl")
print("main: steps", main[-1]["step"], "| median context tokens/s", round(statistics.median(r["tokens_per_s"] for r in main[1:])))
for r in main:
    if r["step"] in (250, 450, 2150):
        print(f"main step {r['step']}: expected acceptance {r['expected_acceptance']:.3f}, pos-1 accuracy {r['acc_pos1']:.3f}")
for name in ("m05", "m1"):
    last = records(root / "curve" / name / "metrics.jsonl")[-1]
    print(f"curve {name}: step {last['step']}, expected acceptance {last['expected_acceptance']:.3f}")
