#!/bin/bash
# Build the device bundles (after `make venv assets`) and check each call against the tool's 64 MiB:
#   bash docs/results/smollm2-h200-12/scripts/bundle.sh
# The tenth run's bundles (docs/results/smollm2-h200-11/scripts/bundle.sh: .gpu/g1, .gpu/g2 = the GGUF
# xz-compressed in two parts, .gpu/syn, .gpu/tok, .whl) with this folder's scripts in .gpu/s. The three answer
# tarballs and the GGUF do not fit one call: three calls back to back on one warm machine, each leaving two
# tarballs out of the tree (`git rm -q --cached` + .git/info/exclude, restored after it; see README.md here).
set -eu
bash docs/results/smollm2-h200-11/scripts/bundle.sh
cp docs/results/smollm2-h200-12/scripts/*.sh .gpu/s/
echo "scripts now: $(ls .gpu/s | paste -sd' ')"
