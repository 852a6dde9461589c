#!/bin/bash
# Build the device-call bundles of this run from a checkout where `make venv assets` has run, and check
# each call's carried files + the tracked tree against the device tool's 64 MiB limit:
#   bash docs/results/smollm2-h200-8/scripts/bundle.sh
# -> .gpu/a (call 1: GGUF part 1, 44 MiB), .gpu/b (call 2: parts 2-3), .gpu/s (these scripts),
#    .gpu/syn (2,000 synthetic conversations for steps.py), .gpu/tok (SmolLM2's tokenizer + config),
#    .whl (datasets, dill, multiprocess, gguf: the device has pyarrow and huggingface-hub, not these).
set -eu
G=assets/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || { echo "no $G: run 'make venv assets' first"; exit 1; }
mkdir -p .gpu/a .gpu/b .gpu/s .gpu/syn .gpu/tok .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
rm -f .gpu/a/part_* .gpu/b/part_*
(cd .gpu && split -b 44M "../$G" part_ && mv part_aa a/ && mv part_a? b/)
cat .gpu/a/part_aa .gpu/b/part_* | sha256sum | grep -q "$(sha256sum "$G" | cut -c1-64)" && echo "GGUF parts: ok"
cp docs/results/smollm2-h200-8/scripts/*.sh docs/results/smollm2-h200-8/scripts/steps.py .gpu/s/
cp assets/smollm2/{config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} .gpu/tok/ 2>/dev/null || true
if [ ! -f .gpu/syn/synth2k.jsonl ]; then  # random-weight step timings: only the lengths matter
  .venv/bin/python -m dflash_train.recipes.offline_data --out /tmp/chat.jsonl
  .venv/bin/python docs/results/multi-gpu-h200/make_synth.py /tmp/chat.jsonl /tmp/synth.jsonl
  head -2000 /tmp/synth.jsonl > .gpu/syn/synth2k.jsonl
fi
for w in datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 gguf==0.19.0; do
  ls .whl/"${w%%==*}"-* >/dev/null 2>&1 || .venv/bin/python -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d .whl "$w"
done
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
for call in "1:.gpu/a .gpu/s .gpu/syn .gpu/tok .whl" "2:.gpu/b .gpu/s .whl" "3:.gpu/s .whl" "4:.gpu/s .whl"; do
  n=${call%%:*}; paths=${call#*:}
  total=$(( tree + $(du -cb $paths | tail -1 | cut -f1) ))
  echo "call $n carries $paths: $(( total / 1048576 )) MiB with the tree (limit 64)"
  [ "$total" -le $(( 64 * 1048576 )) ] || { echo "  over the limit"; exit 1; }
done
