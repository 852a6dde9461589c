#!/bin/bash
# The tenth run's training data from the repo: sets 1 and 2 (docs/results/smollm2-h200-8/scripts/both-sets.sh)
# and set 3, the 45,772 greedy answers to composed prompts (data/greedy-answers-3.tar.xz), as DIR/greedy-0.jsonl,
# DIR/greedy-1.jsonl and DIR/greedy-2.jsonl:
#   bash docs/results/smollm2-h200-11/scripts/three-sets.sh runs/smollm2/data
set -eu
DIR=${1:?usage: three-sets.sh DIR}
bash docs/results/smollm2-h200-8/scripts/both-sets.sh "$DIR"
mkdir -p "$DIR/.set3"
tar xJf docs/results/smollm2-h200-11/data/greedy-answers-3.tar.xz -C "$DIR/.set3"
mv "$DIR/.set3/greedy-0.jsonl" "$DIR/greedy-2.jsonl" && rmdir "$DIR/.set3"
wc -l "$DIR/greedy-2.jsonl"
