# sourced by the device scripts: wheels, env, the kept folder, helpers
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export K=${K:-$KEEP}
mkdir -p "$K" assets "$OUT"
if [ -d .whl ] && [ ! -f $K/site/.done ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $K/site .whl/*.whl >/dev/null 2>&1 && touch $K/site/.done; fi
export PYTHONPATH=$PWD/src:$PWD/tests:$K/site
export TORCHINDUCTOR_CACHE_DIR=$K/inductor XDG_CACHE_HOME=$K/xdg
[ -f "$K/smollm2/config.json" ] && rm -rf assets/smollm2 && ln -sfn "$K/smollm2" assets/smollm2
DFT="python3 -m dflash_train.cli"
PY=python3
D=$K/data
T0=$(date +%s)
left() { echo $(( ${LIMIT:-585} - $(date +%s) + T0 )); }  # seconds left in this call
stage() { echo "== $1: $(( $(date +%s) - T0 ))s" | tee -a "$OUT/stages.log"; }
set_common() {
  DATA_PATHS="data.paths=[$(ls $D/greedy-*.jsonl 2>/dev/null | paste -sd, -)]"
  COMMON="smollm2-1gpu $DATA_PATHS data.cache_dir=$K/cache eval.prompts=null train.progress=false ${EXTRA:-}"
}
HELD=src/dflash_train/recipes/heldout_prompts.txt
