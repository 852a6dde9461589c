#!/usr/bin/env bash
# Mutation testing (issue 60, item 4): mutmut 3.8.1 over the modules where a wrong number is
# silent, each against the narrow set of tests that cover it. Each module runs in a scratch
# copy of the checkout (mutmut writes ./mutants and reads its config from setup.cfg there), so
# the checkout is never touched. mutmut is installed into its own folder (pip --target), not
# into the project's venv: it is a tool of this script, not a dependency of the package.
#
#   scripts/mutation.sh                    # every module below
#   scripts/mutation.sh accounting weighting   # some of them (the names of MODULES)
#   SURVIVORS=1 scripts/mutation.sh blocks     # only the mutants its last report left alive, re-run after
#                                              # new tests; their new fates are merged into that report
#   ONLY='*x_serving_config__* *x__rope_fields__*' scripts/mutation.sh serving   # the mutants of some functions
#                                              # (fnmatch patterns); the others are reported "not checked";
#                                              # with SURVIVORS=1: the survivors among them
#
# The report: docs/results/mutation/<module>.txt (mutmut results: every mutant not killed) and
# one summary line per module on stdout: killed / survived / no tests / timeout. OMP_NUM_THREADS=1:
# mutmut forks a child per mutant, and a fork of a process whose OpenMP pool has started hangs
# (every objective mutant timed out with the default threads).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
TOOL=${MUTMUT_DIR:-${TMPDIR:-/tmp}/mutmut-3.8.1}
OUT=${OUT:-$ROOT/docs/results/mutation}

# module name -> "source file | the tests that cover it | a pytest -k filter (optional)": the objective's
# training runs and torch.compile cases take 2-13 s each, hit by every mutant of the blocks and the
# loss (a run of blocks.py with them: 17 mutants in 2 minutes); the chunked-vs-reference cases in
# eager mode check the same numbers. Tests that read the source itself (ruff over the export paths, the
# run folder's layout spelled only in run_folder.py, every refusal reason having words) fail on mutmut's
# rewritten copy of any module, mutated or not: they are left out of the modules they would stop. The
# decoding core: its own tests, the HF loop's and the accounting's (about 25 s); the end-to-end sampling
# cases (15-21 s each) are left out. The serving format: the export tests without the authors' interface
# (tests/export/test_authors_interface.py decodes with the shipped modeling file, 9 s a run: it checks that
# file, not the config mapping serving.py computes), with the loader's, the read-back checks' and the
# export's fault points (test_faults_wired.py's other points exercise other modules)
SLOW="not learns_and_resumes and not compiled and not tiny_training"
declare -A MODULES=(
  [accounting]="src/dflash_train/eval/accounting.py|tests/test_readme_numbers.py tests/eval/test_compare.py tests/eval/test_eval_accounting.py"
  [weighting]="src/dflash_train/objective/weighting.py|tests/objective"
  [targets]="src/dflash_train/objective/targets.py|tests/objective"
  [blocks]="src/dflash_train/objective/blocks.py|tests/objective tests/data/test_packing.py tests/train/test_objective_wiring.py|$SLOW"
  [loss]="src/dflash_train/objective/loss.py|tests/objective|$SLOW"
  [step]="src/dflash_train/objective/step.py|tests/objective tests/train/test_objective_wiring.py|$SLOW"
  [objconfig]="src/dflash_train/objective/config.py|tests/objective tests/train/test_objective_wiring.py tests/test_config_reference.py|$SLOW"
  [kinds]="src/dflash_train/objective/kinds/*|tests/objective tests/models/test_dspark.py|$SLOW"
  [checkpoint]="src/dflash_train/train/checkpoint.py|tests/train/test_checkpoint_manager.py tests/train/test_checkpoint_mutants.py tests/test_run_folder.py|not only_run_folder_spells_the_layout"
  [tokenize]="src/dflash_train/data/tokenize.py|tests/data|not every_reason_the_code_raises_has_words"
  [core]="src/dflash_train/decoding/core.py|tests/decoding/test_core.py tests/decoding/test_core_mutants.py tests/decoding/test_speculative.py tests/decoding/test_sampling.py tests/eval/test_eval_accounting.py|not end_to_end_sampling"
  [serving]="src/dflash_train/export/serving.py|tests/export/test_export_serving.py tests/export/test_serving_mutants.py tests/export/test_export_folder_mutants.py tests/export/test_export_dflash2.py tests/export/test_export_cli.py tests/eval/test_loader.py tests/faults/test_readback_integrity.py tests/faults/test_faults_wired.py tests/models/test_drafter_config.py|not ruff_clean and not (test_faults_wired and not export and not swept)"
)
ORDER=(accounting weighting targets blocks loss step objconfig kinds checkpoint tokenize core serving)

[ -d "$TOOL/mutmut" ] || "$PY" -m pip install -q --target "$TOOL" mutmut==3.8.1
mkdir -p "$OUT"
for name in "${@:-${ORDER[@]}}"; do
  IFS='|' read -r source tests filter <<<"${MODULES[$name]}"
  work=$(mktemp -d)
  cp -r "$ROOT/src" "$ROOT/tests" "$ROOT/scripts" "$ROOT/docs" "$ROOT/README.md" "$ROOT/pyproject.toml" "$work/"
  ln -s "$ROOT/assets" "$work/assets"
  present=$(cd "$ROOT" && for t in $tests; do if [ -e "$t" ]; then printf '%s\n' "    $t"; fi; done)
  # mutmut copies the whole package into mutants/ (a package split between mutants/src and the
  # editable install would import the installed, unmutated one) and mutates only $source; the package's data files (recipes, templates) go
  # there first, and what the tests read beside the code goes as also_copy
  mkdir -p "$work/mutants"
  (cd "$ROOT" && find src -type f ! -name '*.py' ! -path '*__pycache__*' -exec cp --parents {} "$work/mutants/" \;)
  printf '[mutmut]\nsource_paths = src\nonly_mutate = %s\npytest_add_cli_args_test_selection =\n%s\nalso_copy =\n    scripts\n    docs\n    README.md\n    pyproject.toml\n    assets\npytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -q\n    -x\n' \
    "$source" "$present" >"$work/setup.cfg"
  if [ -n "${filter:-}" ]; then printf '    -k\n    %s\n' "$filter" >>"$work/setup.cfg"; fi
  names=()
  patterns=(); [ -n "${ONLY:-}" ] && read -ra patterns <<<"$ONLY"
  if [ -n "${SURVIVORS:-}" ]; then  # (with ONLY: the survivors among those functions' mutants)
    mapfile -t alive < <(awk -F': ' 'NF==2 && $2!="killed" {print $1}' "$OUT/$name.txt")
    for n in "${alive[@]}"; do  # a survivor is re-run when no pattern is given or one matches it
      matched=; [ ${#patterns[@]} -eq 0 ] && matched=yes; for p in "${patterns[@]}"; do [[ $n == $p ]] && matched=yes; done
      [ -n "$matched" ] && names+=("$n")
    done
  else names=("${patterns[@]}"); fi
  (cd "$work" && PYTHONPATH="$TOOL" HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 nice -n 10 "$PY" -m mutmut run --max-children 2 "${names[@]}" >"$work/run.log" 2>&1) || true
  (cd "$work" && PYTHONPATH="$TOOL" "$PY" -m mutmut results --all true 2>&1 | sed "s/^ *//" >"$work/results.txt") || true
  if [ -n "${SURVIVORS:-}" ]; then  # the re-run mutants' new fates over the last report's lines
    awk -F': ' 'NR==FNR {if (NF==2 && $2!="not checked") fate[$1]=$2; next} NF==2 && ($1 in fate) {print $1 ": " fate[$1]; next} {print}' \
      "$work/results.txt" "$OUT/$name.txt" >"$work/merged.txt" && mv "$work/merged.txt" "$OUT/$name.txt"
  else
    cp "$work/results.txt" "$OUT/$name.txt"
  fi
  counts=$(awk -F': ' 'NF==2 {print $2}' "$OUT/$name.txt" | sort | uniq -c | awk '{n=$1; $1=""; printf "%s%s, ", substr($0, 2), " " n}')
  echo "$name ($source): ${counts%, }"
  [ -n "${KEEP:-}" ] && echo "  kept $work" || rm -rf "$work"
done
