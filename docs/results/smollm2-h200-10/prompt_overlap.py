"""How many user turns of training chat files equal or contain a prompt of a prompt file (normalized,
the prompt synthesizer's own rule: ``PromptSet.is_heldout``):

    python docs/results/smollm2-h200-10/prompt_overlap.py PROMPTS.txt TRAIN.jsonl [TRAIN.jsonl ...]

Run on both committed answer sets (``docs/results/smollm2-h200-8/scripts/both-sets.sh DIR``) for the
held-out and the selection prompts (``prompt_overlap.log``).
"""

import json
import sys

from dflash_train.recipes.prompts import PromptSet, load_heldout

prompts_file, *train_files = sys.argv[1:]
never = PromptSet(load_heldout(prompts_file))
turns = found = 0
for path in train_files:
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            for m in record.get("messages") or record.get("conversations") or []:
                if m.get("role", m.get("from")) in ("user", "human"):
                    turns += 1
                    if never.is_heldout(m.get("content", m.get("value", ""))):
                        found += 1
                        print("found:", m.get("content", m.get("value", ""))[:200])
print(f"{len(never.heldout)} prompts of {prompts_file} against {turns} training user turns: {found} equal or contain one")
