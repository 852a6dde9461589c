# sourced by the device scripts of this folder: wheels, env, the kept folder ($K survives between calls while
# the machine stays warm), helpers. Results accumulate in $K/res and come back as one tarball per call.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export K=${K:-${KEEP:-$HOME/keep}}
mkdir -p "$K" assets "$OUT"
RES=$K/res; mkdir -p "$RES"
trap 'tar -C $K -czf $OUT/res.tgz res' EXIT
if [ -d .gpu/w ] && [ ! -f $K/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $K/site .gpu/w/*.whl && touch $K/site/.done
fi
export PYTHONPATH=$PWD/src:$PWD/tests:$K/site
export TORCHINDUCTOR_CACHE_DIR=$K/inductor XDG_CACHE_HOME=$K/xdg
[ -f "$K/smollm2/config.json" ] && rm -rf assets/smollm2 && ln -sfn "$K/smollm2" assets/smollm2
DFT="python3 -m dflash_train.cli"
T0=$(date +%s)
left() { echo $(( ${LIMIT:-585} - $(date +%s) + T0 )); }  # seconds left in this call
stage() { echo "== $1: $(( $(date +%s) - T0 ))s" | tee -a "$RES/stages.log"; }
