#!/bin/bash
# Build this run's device bundles (after `make venv assets`): the eighth run's bundles (GGUF xz parts .gpu/g1 and
# .gpu/g2, .gpu/syn, .gpu/tok, .whl, its scripts in .gpu/s), with this run's scripts laid over .gpu/s:
#   bash docs/results/smollm2-h200-10/scripts/bundle.sh
# Call 1 travels without the two committed answer tarballs, as the eighth run's bundle.sh says.
set -eu
bash docs/results/smollm2-h200-9/scripts/bundle.sh
cp docs/results/smollm2-h200-10/scripts/* .gpu/s/
echo "scripts: $(ls .gpu/s | paste -sd' ')"
