#!/bin/bash
# The seventh run's training data from the repo: set 1 (the fifth run's 67,198 greedy answers) and set 2
# (116,021 answers to prompts SmolLM2 wrote with SEED=1, none of set 1's), as DIR/greedy-0.jsonl and
# DIR/greedy-1.jsonl (both tarballs hold a file named greedy-0.jsonl):
#   bash docs/results/smollm2-h200-8/scripts/both-sets.sh runs/smollm2/data
#   dflash-train train smollm2-1gpu "data.paths=[runs/smollm2/data/greedy-0.jsonl,runs/smollm2/data/greedy-1.jsonl]" ...
set -eu
DIR=${1:?usage: both-sets.sh DIR}
mkdir -p "$DIR" "$DIR/.set2"
tar xJf docs/results/smollm2-h200-6/data/greedy-answers.tar.xz -C "$DIR"
tar xJf docs/results/smollm2-h200-8/data/greedy-answers-2.tar.xz -C "$DIR/.set2"
mv "$DIR/.set2/greedy-0.jsonl" "$DIR/greedy-1.jsonl" && rmdir "$DIR/.set2"
wc -l "$DIR"/greedy-0.jsonl "$DIR"/greedy-1.jsonl
