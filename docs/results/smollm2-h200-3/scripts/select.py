"""Ablation table (paired per-prompt differences vs base) and the main run's overrides.

Selection uses held-out prompts 25-40 only; prompts 1-24 (the reported set) are shown but
not used to choose. Rule: every change is kept when its mean paired difference on 25-40 is
positive (the learning rate: the better of the two)."""
import json
import sys
from dataclasses import asdict
from pathlib import Path

from dflash_train.eval.compare import compare, format_rows, load_report, parse_range

root = Path(sys.argv[1])
lines = [line.split("|", 1) for line in (root / "list.txt").read_text().splitlines() if line.strip()]
overrides = {name: ov.strip() for name, ov in lines}
reports = {}
for n in overrides:
    try:
        reports[n] = load_report(root / n / "eval.json")
    except ValueError as err:
        print(f"missing: {n}: {err}")
if "base" not in reports:
    (root / "selection.txt").write_text("\n")
    sys.exit("no base evaluation: nothing selected")
def paired(span):
    try:
        return [compare(reports["base"], reports[n], n, parse_range(span)) for n in overrides if n != "base" and n in reports]
    except ValueError as err:
        print(f"prompts {span}: {err}")
        return []


rows = {span: paired(span) for span in ("25-40", "1-24", "1-40")}
md = "\n\n".join(f"prompts {span}:\n" + format_rows(r) for span, r in rows.items())
for n in overrides:
    s = root / n / "summary.json"
    if s.exists():
        summ = json.loads(s.read_text())
        md += (f"\n{n}: steps {summ.get('steps')}, "
               f"last loss {summ.get('last_loss')}, last expected acceptance {summ.get('last_expected_acceptance')}")
(root / "compare.md").write_text(md + "\n")
(root / "compare.json").write_text(json.dumps({k: [asdict(x) for x in v] for k, v in rows.items()}, indent=1))
print(md)
chosen = [overrides[r.variant] for r in rows["25-40"] if r.mean_diff > 0]
line = " ".join(chosen)
(root / "selection.txt").write_text(line + "\n")
print("selected overrides:", line or "(none: the recipe as is)")
