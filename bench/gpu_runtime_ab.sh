#!/usr/bin/env bash
# Two runtimes side by side on the H200 in one device call, on one plan: the tree's and an older
# commit's packages extracted into old09/ (untracked, it travels with the tree):
#   rm -rf old09 && mkdir old09 && git archive <old sha> teraio teraio_run teraio_profile teraio_plan | tar -x -C old09
#   device: TERAIO_COMMIT=<sha> bash bench/gpu_runtime_ab.sh   (carry [".whl"]; ~90 s)
# The older code profiles and plans (newer code reads older files, not the reverse); then the
# 1B example (bf16, deterministic) runs under that plan with new, old, new runtimes.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
OLD=$PWD/old09; NEW=$PWD; ARGS="--preset 1b --autocast bf16 --deterministic --steps 6 --log-every 0"
echo "A/B $(date -u +%FT%TZ): runtime at 09d43e9 (old09/) and at ${TERAIO_COMMIT}, one plan made by 09d43e9"
(cd $OLD && PYTHONPATH=/tmp/site:$OLD timeout 60 python3 -m teraio profile -o /tmp/t.msgpack --warmup 2 --iterations 2 -- python3 $OLD/teraio/examples/train_gpt.py $ARGS > /dev/null 2>&1)
PEAK=$(cd $OLD && PYTHONPATH=/tmp/site:$OLD python3 -m teraio inspect /tmp/t.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
(cd $OLD && PYTHONPATH=/tmp/site:$OLD python3 -m teraio plan /tmp/t.msgpack --gpu-mem $((PEAK/2)) --ssds 0 --host-mem 32GiB --host-gbps 37 --pcie-gbps 55 --headroom 1GiB -o /tmp/p.json | grep -E "entries|iteration")
for V in new old new; do
  D=$([[ $V == old ]] && echo $OLD || echo $NEW)
  (cd $D && PYTHONPATH=/tmp/site:$D timeout 50 python3 -m teraio run --plan /tmp/p.json --report $OUT/run_$V.$RANDOM.json -- python3 $D/teraio/examples/train_gpt.py $ARGS 2>&1 | grep -E "median_step_ms|iteration .* measured|Error")
  echo "^ $V"
done
