"""The main run's recipe from call 2's ablations, by a rule fixed before they ran:

    python select.py ABL_DIR   (prints a reason, then the chosen overrides on the last line)

1. the variant with the largest paired gain over the base on held-out prompts 25-40 (prompts 1-24
   stay clean for the report), if that gain is above one standard error;
2. else the largest gain on prompts 1-40, if positive;
3. else reach weighting (the new objective, measured at the main run's length).
"""

import json
import sys
from pathlib import Path

abl = Path(sys.argv[1])
rows = json.loads((abl / "compare.json").read_text())


def best(prompts, ok):
    cands = [r for r in rows if r["prompts"] == prompts and ok(r)]
    return max(cands, key=lambda r: r["mean_diff"]) if cands else None


pick, why = best("25-40", lambda r: r["mean_diff"] > r["stderr"]), "largest gain on 25-40 above 1 SE"
if pick is None:
    pick, why = best("1-40", lambda r: r["mean_diff"] > 0), "no gain on 25-40 above 1 SE; largest positive on 1-40"
name = Path(pick["variant"]).parent.name if pick else "reach"
if pick is None:
    why = "no positive gain; reach weighting by default"
else:
    why += f": {name} {pick['mean_diff']:+.3f} +- {pick['stderr']:.3f} ({pick['prompts']})"
print(f"# {why}")
print((abl / name / "overrides.txt").read_text().strip())
