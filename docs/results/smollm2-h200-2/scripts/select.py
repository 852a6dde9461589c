"""Ablation table (paired per-prompt differences vs base) and the main run's overrides.

Selection uses held-out prompts 25-40 only; prompts 1-24 (the reported set) are shown but
not used to choose. Rule: the best of the three learning rates; every other change is kept
when its mean paired difference on 25-40 is positive."""
import json
import sys
from dataclasses import asdict
from pathlib import Path

from dflash_train.eval.compare import compare, format_rows, load_report, parse_range

root = Path(sys.argv[1])
names = [line.split("|")[0] for line in (root / "list.txt").read_text().splitlines() if line.strip()]
reports = {}
for n in names:
    try:
        reports[n] = load_report(root / n / "eval.json")
    except ValueError as err:
        print(f"missing: {n}: {err}")
if "base" not in reports:
    (root / "selection.txt").write_text("")
    sys.exit("no base evaluation: nothing selected")
rows = {span: [compare(reports["base"], reports[n], n, parse_range(span)) for n in names if n != "base" and n in reports]
        for span in ("25-40", "1-24")}
md = "\n\n".join(f"prompts {span}:\n" + format_rows(r) for span, r in rows.items())
for n in names:
    s = root / n / "summary.json"
    if s.exists():
        summ = json.loads(s.read_text())
        md += f"\n{n}: steps {summ.get('steps')}, last loss {summ.get('last_loss')}, last expected acceptance {summ.get('last_expected_acceptance')}"
(root / "compare.md").write_text(md + "\n")
(root / "compare.json").write_text(json.dumps({k: [asdict(x) for x in v] for k, v in rows.items()}, indent=1))
print(md)
sel = {r.variant: r for r in rows["25-40"]}
lrs = {"base": ("", rows["25-40"][0].base_tau if rows["25-40"] else 0.0)}
for n, ov in (("lr1.2e-3", "optim.lr=1.2e-3"), ("lr2e-3", "optim.lr=2e-3")):
    if n in sel:
        lrs[n] = (ov, sel[n].variant_tau)
chosen = [max(lrs.values(), key=lambda v: v[1])[0]]
keep = {"gamma4": "train.gamma=4", "half-batch": "data.token_budget=16384", "anchors128": "train.num_anchors=128"}
keep.update(dict(x.rsplit("=", 1)[::-1] for x in sys.argv[2:]))  # extra: OVERRIDE=name pairs, e.g. the helper options
for n, ov in keep.items():
    if n in sel and sel[n].mean_diff > 0:
        chosen.append(ov)
line = " ".join(c for c in chosen if c)
(root / "selection.txt").write_text(line + "\n")
print("selected overrides:", line or "(none: the recipe as is)")
