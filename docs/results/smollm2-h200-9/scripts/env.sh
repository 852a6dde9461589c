# sourced by every device script: wheels, env, the kept folder, helpers
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
K=${K:-/root/keep}
mkdir -p "$K" assets "$OUT"
if [ -d .whl ] && [ ! -f /tmp/site/.done ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 && touch /tmp/site/.done; fi
export PYTHONPATH=$PWD/src:/tmp/site PATH=/tmp/site/bin:$PATH
export TORCHINDUCTOR_CACHE_DIR=$K/inductor XDG_CACHE_HOME=$K/xdg
[ -f "$K/smollm2/config.json" ] && ln -sfn "$K/smollm2" assets/smollm2
DFT=${DFT:-"python3 -m dflash_train.cli"}
PY=${PY:-python3}
DEV=${DEV:-cuda}
D=$K/data
T0=$(date +%s)
left() { echo $(( ${LIMIT:-585} - $(date +%s) + T0 )); }  # seconds left in this call
stage() { echo "== $1: $(( $(date +%s) - T0 ))s" | tee -a "$OUT/stages.log"; }
ts() { while IFS= read -r l; do printf '%s %s\n' "$(date +%T)" "$l"; done; }
gpu() { if [ "$DEV" = cuda ]; then echo "CUDA_VISIBLE_DEVICES=$1"; else echo "CUDA_VISIBLE_DEVICES="; fi; }
# every training run here: the recipe, the regenerated data, one cache, no in-training evaluation
set_common() {
  DATA_PATHS="data.paths=[$(ls $D/greedy-*.jsonl 2>/dev/null | paste -sd, -)]"
  COMMON="smollm2-1gpu $DATA_PATHS data.cache_dir=$K/cache eval.prompts=null train.progress=false train.epochs=1000 ${EXTRA:-} $([ "$DEV" = cpu ] && echo train.device=cpu)"
}
set_common
HELD=src/dflash_train/recipes/heldout_prompts.txt
RL=${REPLAY_LIMIT:-40}; RT=${REPLAY_TOKENS:-128}  # replay: held-out prompts and new tokens (a CPU dry run uses less)
