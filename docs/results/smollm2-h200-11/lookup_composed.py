"""How copy-heavy SmolLM2's answers to the composed prompts are, beside the ninth run's measure of the
held-out answers and the first two sets (prompt-lookup tau, data/lookup.py; loops trimmed; first 128 / 256
tokens; 1,500 random answers, those of at least 32 tokens counted):

    mkdir -p DIR && tar xJf docs/results/smollm2-h200-11/data/greedy-answers-3.tar.xz -C DIR
    python docs/results/smollm2-h200-11/lookup_composed.py DIR/greedy-0.jsonl OUT.json   # CPU, seconds
"""

import json
import random
import statistics as st
import sys
from pathlib import Path

from transformers import AutoTokenizer

from dflash_train.data.lookup import lookup_tau
from dflash_train.data.loops import loop_cut

answers, out = Path(sys.argv[1]), Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained("assets/smollm2")


def answer_tau(prompt: str, answer: str, length: int) -> tuple[float, int]:
    ctx = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    cut = loop_cut(ids)
    ids = (ids[:cut] if cut else ids)[:length]
    return lookup_tau(ctx + ids, [0] * len(ctx) + [1] * len(ids)), len(ids)


report = {}
sample = random.Random(3).sample(answers.read_text().splitlines(), 1500)
for length in (128, 256):
    taus = []
    for line in sample:
        m = json.loads(line)["messages"]
        tau, n = answer_tau(m[0]["content"], m[-1]["content"], length)
        if n >= 32:
            taus.append(tau)
    report[f"composed@{length}"] = {"n": len(taus), "mean": st.mean(taus), "median": st.median(taus),
                                    "share_above_2": sum(t > 2 for t in taus) / len(taus)}
for key, row in report.items():
    print(key, {k: round(v, 3) for k, v in row.items()})
out.write_text(json.dumps(report, indent=1))
