#!/bin/bash
# Build this run's device bundles (after `make venv assets`) and check each call against the tool's 64 MiB:
#   bash docs/results/smollm2-h200-9/scripts/bundle.sh
# The GGUF goes xz-compressed (98.4 -> 90.4 MB) in two parts: .gpu/g1 (call 1) and .gpu/g2 (call 2).
# Call 1 travels without the two committed answer tarballs (20.8 MB): run it after
#   git rm -q --cached $TARBALLS && printf '%s\n' $TARBALLS >> .git/info/exclude
# and restore them before call 2 (`git reset -q -- $TARBALLS`, then drop those lines from the exclude file).
set -eu
G=assets/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || { echo "no $G: run 'make venv assets' first"; exit 1; }
TARBALLS="docs/results/smollm2-h200-6/data/greedy-answers.tar.xz docs/results/smollm2-h200-8/data/greedy-answers-2.tar.xz"
# .gpu/s, .gpu/syn, .gpu/tok and .whl as the seventh run built them
bash docs/results/smollm2-h200-8/scripts/bundle.sh > /tmp/bundle.log 2>&1 || grep -q "over the limit" /tmp/bundle.log \
  || { cat /tmp/bundle.log; exit 1; }
rm -rf .gpu/a .gpu/b .gpu/g1 .gpu/g2 .gpu/s && mkdir -p .gpu/g1 .gpu/g2 .gpu/s
cp docs/results/smollm2-h200-9/scripts/* .gpu/s/
[ -f /tmp/gguf.xz ] || xz -T2 -9 -k -c "$G" > /tmp/gguf.xz
head -c 53000000 /tmp/gguf.xz > .gpu/g1/part_1
tail -c +53000001 /tmp/gguf.xz > .gpu/g2/part_2
cat .gpu/g1/part_1 .gpu/g2/part_2 | xz -dc | sha256sum | grep -q "$(sha256sum "$G" | cut -c1-64)" && echo "GGUF parts: ok"
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
tarballs=$(du -cb $TARBALLS | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
untracked=${untracked:-0}
check() {  # call, tree bytes, carried paths
  total=$(( $2 + untracked + $(du -cb $3 | tail -1 | cut -f1) ))
  echo "call $1 carries $3: $(( total / 1048576 )).$(( total % 1048576 * 10 / 1048576 )) MiB with the tree (limit 64)"
  [ "$total" -le $(( 64 * 1048576 )) ] || { echo "  over the limit"; exit 1; }
}
if git ls-files --error-unmatch $TARBALLS >/dev/null 2>&1; then tree1=$(( tracked - tarballs )); else tree1=$tracked; fi
check 1 $tree1 ".gpu/g1 .gpu/s .gpu/syn .gpu/tok .whl"
check 2 $(( tree1 + tarballs )) ".gpu/g2 .gpu/s .whl"
check 3 $(( tree1 + tarballs )) ".gpu/s .whl"
