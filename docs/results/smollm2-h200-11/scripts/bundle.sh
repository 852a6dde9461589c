#!/bin/bash
# Build the device bundles (after `make venv assets`) and check each call against the tool's 64 MiB:
#   bash docs/results/smollm2-h200-11/scripts/bundle.sh
# .gpu/syn, .gpu/tok and .whl as the seventh run built them; the GGUF xz-compressed in two parts (.gpu/g1,
# .gpu/g2); the scripts of this folder (with env.sh, evalrun.sh, replayrun.sh, steps.py of the eighth run and c4.sh of the ninth) in .gpu/s.
# As run (tenth run): part 1 was the first 53,000,000 bytes; call 1 travelled without the two answer tarballs
# then committed (T1, T2; `git rm -q --cached` + .git/info/exclude, restored after it), call 2 with them. With
# this run's tarball (T3) committed too, that call 2 no longer fits: the sizes printed are for the next split
# (part 1 = 50,000,000 bytes), three calls back to back on one warm machine (a warm call costs only its own
# time): 1 = .gpu/g1 + the tree without T1 T2 (copy T3 into /root/keep), 2 = .gpu/g2 + the tree without T2 T3
# (copy T1), 3 = the tree without T1 T3 (copy T2).
set -eu
G=assets/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || { echo "no $G: run 'make venv assets' first"; exit 1; }
T1=docs/results/smollm2-h200-6/data/greedy-answers.tar.xz T2=docs/results/smollm2-h200-8/data/greedy-answers-2.tar.xz
T3=docs/results/smollm2-h200-11/data/greedy-answers-3.tar.xz
bash docs/results/smollm2-h200-8/scripts/bundle.sh > /tmp/bundle.log 2>&1 || grep -q "over the limit" /tmp/bundle.log \
  || { cat /tmp/bundle.log; exit 1; }
rm -rf .gpu/a .gpu/b .gpu/g1 .gpu/g2 .gpu/s && mkdir -p .gpu/g1 .gpu/g2 .gpu/s
cp docs/results/smollm2-h200-9/scripts/{env.sh,evalrun.sh,replayrun.sh,steps.py} docs/results/smollm2-h200-10/scripts/c4.sh \
  docs/results/smollm2-h200-11/scripts/* .gpu/s/
[ -s /tmp/gguf.xz ] || xz -T2 -9 -k -c "$G" > /tmp/gguf.xz
head -c 50000000 /tmp/gguf.xz > .gpu/g1/part_1
tail -c +50000001 /tmp/gguf.xz > .gpu/g2/part_2
cat .gpu/g1/part_1 .gpu/g2/part_2 | xz -dc | sha256sum | grep -q "$(sha256sum "$G" | cut -c1-64)" && echo "GGUF parts: ok"
echo "scripts: $(ls .gpu/s | paste -sd' ')"
size() { du -cb "$@" 2>/dev/null | tail -1 | cut -f1; }
tree=$(( $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) + $(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1) ))
check() {  # call, tarballs left out of the tree, carried paths
  total=$(( tree - $(size $2) + $(size $3) ))
  echo "call $1 (tree without $(for t in $2; do basename $t; done | paste -sd' ')) + $3: $(( total / 1048576 )).$(( total % 1048576 * 10 / 1048576 )) MiB (limit 64)"
  [ "$total" -le $(( 64 * 1048576 )) ] || echo "  over the limit"
}
check 1 "$T1 $T2" ".gpu/g1 .gpu/s .whl"
check 2 "$T2 $T3" ".gpu/g2 .gpu/s .whl"
check 3 "$T1 $T3" ".gpu/s .whl"
