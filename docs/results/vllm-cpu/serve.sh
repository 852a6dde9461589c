#!/usr/bin/env bash
# The CPU serving line that `make demo`, `export` and the README print (export/serving.py: vllm_cpu_line), run as
# printed for DRAFTER (a DFlash export, B = 8), one chat completion over HTTP, then vLLM's spec-decode counters.
# Usage: bash docs/results/vllm-cpu/serve.sh DRAFTER OUT_DIR   (from the repository root, project env active)
set -uo pipefail
export HF_HUB_OFFLINE=1
D=$1 OUT=$2
mkdir -p "$OUT"
LINE=$(python -c "import sys; from dflash_train.export.serving import vllm_cpu_line; print(vllm_cpu_line('dflash', 'assets/smollm2', sys.argv[1], 8))" "$D")
echo "$LINE" > "$OUT/serve-line.txt"
setsid bash -c "$LINE --port 8011" > "$OUT/serve.log" 2>&1 &  # its own process group: stopped whole below
pid=$!
for _ in $(seq 1 150); do curl -s localhost:8011/health > /dev/null && break; sleep 2; done
curl -s localhost:8011/v1/chat/completions -H 'Content-Type: application/json' -d '{"model": "assets/smollm2",
  "messages": [{"role": "user", "content": "Explain how a refrigerator keeps food cold."}], "max_tokens": 40,
  "temperature": 0}' > "$OUT/serve-completion.json"
curl -s localhost:8011/metrics | grep '^vllm:spec_decode.*_total' > "$OUT/serve-metrics.txt"
kill -- -"$pid"; wait "$pid"
cat "$OUT/serve-completion.json"; echo; cat "$OUT/serve-metrics.txt"
