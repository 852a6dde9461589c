"""Mean per-token NLL of user prompts under SmolLM2 (plain text, no chat template): the 40 held-out
prompts vs 300 random prompts of each training set. CPU, ~1 minute:

    bash docs/results/smollm2-h200-8/scripts/both-sets.sh DIR
    python docs/results/smollm2-h200-8/prompt_nll.py docs/results/smollm2-h200-8/prompt_nll.json DIR
"""
import json, random, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained("assets/smollm2")
model = AutoModelForCausalLM.from_pretrained("assets/smollm2", dtype=torch.float32).eval()
torch.set_num_threads(2)

def nll(texts):
    out = []
    for i in range(0, len(texts), 16):
        batch = texts[i:i + 16]
        enc = tok(batch, return_tensors="pt", padding=True)
        with torch.no_grad():
            logits = model(**enc).logits[:, :-1].float()
        labels = enc.input_ids[:, 1:]
        mask = enc.attention_mask[:, 1:].bool()
        lp = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
        out += [(lp[j][mask[j]].mean().item()) for j in range(len(batch))]
    return out

def users(path, n, rng):
    lines = open(path).readlines()
    rows = [json.loads(l)["messages"][0]["content"] for l in rng.sample(lines, n)]
    return rows

DATA = sys.argv[2]  # both-sets.sh DIR
rng = random.Random(0)
tok.padding_side = "right"
if tok.pad_token is None:
    tok.pad_token = tok.eos_token
held = [l.strip() for l in open("src/dflash_train/recipes/heldout_prompts.txt") if l.strip()]
sets = {"held-out (40)": held, "set 1 (300 random)": users(f"{DATA}/greedy-0.jsonl", 300, rng),
        "set 2 (300 random)": users(f"{DATA}/greedy-1.jsonl", 300, rng)}
res = {}
for name, texts in sets.items():
    v = sorted(nll(texts))
    res[name] = {"n": len(v), "mean": sum(v) / len(v), "median": v[len(v) // 2], "p90": v[int(0.9 * len(v))]}
    print(name, {k: round(x, 3) if isinstance(x, float) else x for k, x in res[name].items()}, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
