"""The synthetic chat set of the multi-GPU throughput runs (random-weight targets: only lengths matter).

    python -m dflash_train.recipes.offline_data --out .gpu/data/chat.jsonl   # the demo's word pool
    python docs/results/multi-gpu-h200/make_synth.py .gpu/data/chat.jsonl .gpu/data/synth.jsonl

8,000 conversations: a user turn of 25-110 words and an answer of 15-240 words drawn from the
demo set's words (seed 0); 7,825 kept by the tokenizer (>= 32 supervised tokens), lengths up to 512.
"""

import json
import random
import sys

words = []
for line in open(sys.argv[1]):
    for message in json.loads(line).get("messages", []):
        words += message["content"].split()
random.seed(0)
with open(sys.argv[2], "w") as out:
    for _ in range(8000):
        prompt = " ".join(random.choices(words, k=random.randint(25, 110)))
        answer = " ".join(random.choices(words, k=random.randint(15, 240)))
        out.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                           {"role": "assistant", "content": answer}]}) + "\n")
