#!/bin/bash
# Build the device bundles (after `make venv assets`) and check each call against the tool's 64 MiB:
#   bash docs/results/smollm2-h200-13/scripts/bundle.sh
# The eleventh run's bundles (.gpu/g1, .gpu/g2 = the GGUF xz-compressed in two parts, .whl) with this folder's
# scripts in .gpu/s; three calls for the setup, as there (scripts/README.md).
set -eu
bash docs/results/smollm2-h200-12/scripts/bundle.sh
cp docs/results/smollm2-h200-13/scripts/*.sh .gpu/s/
echo "scripts now: $(ls .gpu/s | paste -sd' ')"
