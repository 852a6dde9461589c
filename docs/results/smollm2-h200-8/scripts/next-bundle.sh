#!/bin/bash
# For the next session (the repo now holds both answer sets, ~25 MiB of tracked files): the GGUF no longer
# goes over in two calls beside the tree. This builds one folder per GGUF part, .gpu/g1 .. .gpu/gN, each
# small enough to travel with the tree, the scripts, the wheels, SmolLM2's tokenizer and the 2,000
# synthetic conversations (call 1's load), and checks every call against the 64 MiB limit:
#   bash docs/results/smollm2-h200-8/scripts/next-bundle.sh
# Call k carries .gpu/gk (and copies it to /root/keep/m); the call after the last part assembles the file:
#   cat /root/keep/m/part_* > /root/keep/m/SmolLM2-135M-Instruct.Q4_1.gguf   (sha256 in ../../../shared docs)
set -eu
G=assets/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || { echo "no $G: run 'make venv assets' first"; exit 1; }
# .gpu/s, .gpu/syn, .gpu/tok, .whl as bundle.sh builds them (its own size check, for the two-part split, now fails)
bash docs/results/smollm2-h200-8/scripts/bundle.sh > /tmp/bundle.log 2>&1 || grep -q "over the limit" /tmp/bundle.log \
  || { cat /tmp/bundle.log; exit 1; }
rm -rf .gpu/a .gpu/b .gpu/g*
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
extra=$(du -cb .gpu/s .gpu/syn .gpu/tok .whl | tail -1 | cut -f1)
part=$(( 64 * 1048576 - tree - extra - 1048576 ))  # 1 MiB to spare
[ "$part" -gt 8388608 ] || { echo "the tree ($(( tree / 1048576 )) MiB) leaves no room for GGUF parts"; exit 1; }
(cd .gpu && split -b "$part" "../$G" part_)
n=0
for f in .gpu/part_*; do n=$((n + 1)); mkdir -p .gpu/g$n && mv "$f" .gpu/g$n/; done
cat .gpu/g*/part_* | sha256sum | grep -q "$(sha256sum "$G" | cut -c1-64)" && echo "GGUF in $n parts: ok"
for k in $(seq 1 $n); do
  total=$(( tree + extra + $(du -cb .gpu/g$k | tail -1 | cut -f1) ))
  echo "call $k carries .gpu/g$k .gpu/s .gpu/syn .gpu/tok .whl: $(( total / 1048576 )) MiB with the tree (limit 64)"
  [ "$total" -le $(( 64 * 1048576 )) ] || { echo "  over the limit"; exit 1; }
done
