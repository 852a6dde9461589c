# sourced by the device scripts of this folder: wheels, env, the kept folder, helpers
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export K=${K:-$KEEP}
mkdir -p "$K" assets "$OUT"
# results accumulate in $K/res across calls; each call brings all of them back as one tarball (8 files at most come back)
RES=$K/res; mkdir -p $RES
trap 'tar -C $K -czf $OUT/res.tgz res' EXIT
if [ -d .gpu/w ] && [ ! -f $K/site/.done ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $K/site .gpu/w/*.whl >/dev/null 2>&1 && touch $K/site/.done; fi
export PYTHONPATH=$PWD/src:$PWD/tests:$K/site
export TORCHINDUCTOR_CACHE_DIR=$K/inductor XDG_CACHE_HOME=$K/xdg
[ -f "$K/smollm2/config.json" ] && rm -rf assets/smollm2 && ln -sfn "$K/smollm2" assets/smollm2
DFT="python3 -m dflash_train.cli"
D=$K/data
T0=$(date +%s)
left() { echo $(( ${LIMIT:-585} - $(date +%s) + T0 )); }  # seconds left in this call
stage() { echo "== $1: $(( $(date +%s) - T0 ))s" | tee -a "$RES/stages.log"; }
PATHS="data.paths=[$D/greedy-0.jsonl,$D/greedy-1.jsonl,$D/greedy-2.jsonl]"
# the recipe (smollm2-1gpu) as reproduce.sh runs it, with the data cache kept between calls
COMMON="smollm2-1gpu $PATHS data.cache_dir=$K/cache train.feature_cache_gib=124 eval.prompts=null train.log_every=100 train.progress=false"
EV="--target assets/smollm2 --block-size 16 --max-new-tokens 128 --engine static --compile --compile-steps draft --fuse-projections"
# train ARM MINUTES OVERRIDES...: the recipe on the three answer sets, decontaminated (the default)
train_arm() {
  local arm=$1 min=$2; shift 2
  rm -rf $K/$arm; mkdir -p $K/$arm $RES/$arm
  echo "$DFT train $COMMON train.run_dir=$K/$arm/run train.time_budget_minutes=$min $*" > $RES/$arm/cmd.txt
  timeout $(( $(left) - 20 )) $DFT train $COMMON train.run_dir=$K/$arm/run train.time_budget_minutes=$min "$@" > $K/$arm/train.log 2>&1
  echo "train $arm rc=$?"; tail -3 $K/$arm/train.log
  cp $K/$arm/train.log $K/$arm/run/summary.json $K/$arm/run/metrics.jsonl $RES/$arm/ 2>/dev/null
  $DFT export $K/$arm/run $K/$arm/drafter --target assets/smollm2 --force --dtype float32 > $RES/$arm/export.log 2>&1
  echo "export $arm rc=$?"; stage "train+export $arm"
}
# eval_arm ARM DTYPE: the 40 heldout prompts by speculative decoding (fp32 with split-K), tau, speedup, lossless check
eval_arm() {
  local arm=$1 dt=$2 lin=""
  [ $dt = float32 ] && lin="--linear splitk"
  timeout $(( $(left) - 15 )) $DFT eval $EV --drafter $K/$arm/drafter --prompts heldout --limit 40 --dtype $dt $lin --out $RES/$arm/heldout-$dt > $RES/$arm/eval-$dt.log 2>&1
  echo "eval $arm $dt rc=$?"; tail -2 $RES/$arm/eval-$dt.log; stage "eval $arm $dt"
}
# replay_arm ARM: greedy tau on the 96 selection prompts (the set choices are made on), replayed
replay_arm() {
  timeout $(( $(left) - 5 )) $DFT replay --target assets/smollm2 --drafter $K/$1/drafter --prompts selection --max-new-tokens 128 --dtype float32 --references $K/refs-selection.json --batched --out $RES/$1/selection > $RES/$1/replay.log 2>&1
  echo "replay $1 rc=$?"; tail -1 $RES/$1/replay.log; stage "replay $1"
}
