"""How copy-heavy SmolLM2's answers are: prompt-lookup tau (data/lookup.py) of its greedy answers to the
held-out prompts against random answers of the two training sets (loops trimmed, first 128 / 256 tokens).

    bash docs/results/smollm2-h200-8/scripts/both-sets.sh DIR
    python docs/results/smollm2-h200-9/lookup_gap.py DIR OUT   # CPU, ~5 min (40 greedy answers of 256 tokens)
"""

import json
import random
import statistics as st
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_train.data.lookup import lookup_tau
from dflash_train.data.loops import loop_cut
from dflash_train.recipes.prompts import load_heldout

data, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
tok = AutoTokenizer.from_pretrained("assets/smollm2")
end = tok.convert_tokens_to_ids("<|im_end|>")


def prompt_ids(text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   return_dict=True)["input_ids"]


def answer_tau(ctx, answer, length):
    cut = loop_cut(answer)
    answer = (answer[:cut] if cut else answer)[:length]
    return lookup_tau(ctx + answer, [0] * len(ctx) + [1] * len(answer)), len(answer)


answers_file = out / "heldout_answers.json"
if not answers_file.exists():
    model = AutoModelForCausalLM.from_pretrained("assets/smollm2", dtype=torch.float32).eval()
    answers = []
    for text in load_heldout():
        ctx = prompt_ids(text)
        new = model.generate(torch.tensor([ctx]), max_new_tokens=256, do_sample=False)[0, len(ctx):].tolist()
        answers.append([text, new[: new.index(end)] if end in new else new])
    answers_file.write_text(json.dumps(answers))
heldout = json.loads(answers_file.read_text())
report = {}
for length in (128, 256):
    taus = [answer_tau(prompt_ids(p), a, length)[0] for p, a in heldout]
    report[f"heldout@{length}"] = {"n": len(taus), "mean": st.mean(taus), "median": st.median(taus),
                                   "first24_mean": st.mean(taus[:24]), "share_above_2": sum(t > 2 for t in taus) / len(taus)}
rng = random.Random(3)
for name in ("greedy-0.jsonl", "greedy-1.jsonl"):
    sample = rng.sample((data / name).read_text().splitlines(), 1500)
    for length in (128, 256):
        taus = []
        for line in sample:
            m = json.loads(line)["messages"]
            tau, n = answer_tau(prompt_ids(m[0]["content"]), tok(m[-1]["content"], add_special_tokens=False)["input_ids"],
                                length)
            if n >= 32:
                taus.append(tau)
        report[f"{name}@{length}"] = {"n": len(taus), "mean": st.mean(taus), "median": st.median(taus),
                                      "share_above_2": sum(t > 2 for t in taus) / len(taus)}
for key, row in report.items():
    print(key, {k: round(v, 3) for k, v in row.items()})
(out / "lookup_gap.json").write_text(json.dumps(report, indent=1))
