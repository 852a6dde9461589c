# sourced by the device scripts: wheels, tokenizer, env
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/src:/tmp/site PATH=/tmp/site/bin:$PATH
mkdir -p assets/smollm2 /root/keep && cp -n .gpu/tok/* assets/smollm2/
ts() { while IFS= read -r l; do printf '%s %s\n' "$(date +%T)" "$l"; done; }
REF="--target-config qwen3-8b --drafter-layers 5 --block-size 16 --target-layer-ids 1,9,17,25,33 --num-anchors 512 --seq-len 3072 --attention flex --compile --batch-size 1"
DFT="python3 -m dflash_train.cli"
