#!/usr/bin/env bash
# TeraIO on the H200, in one device call (<= 10 min): the 1B example (bf16 autocast, fused
# AdamW, seq 2048, batch 8, deterministic kernels) plain and uncapped, then profiled, planned
# for each share of its traced peak in $SHARES (default "50 75"), and run under that cap;
# losses compared bit for bit. Results land flat in $OUT (at most 8 files come back).
# Device tool: carry [".whl"], command `TERAIO_COMMIT=<sha> bash bench/gpu_teraio.sh`;
# CHECK_PLAIN_TWICE=1 also checks that two plain runs agree (they do with --deterministic);
# GPU_TESTS=1 first runs tests/test_gpu.py (pytest is on the machine). Varying shapes (issue 13):
#   EXTRA_ARGS="--min-seq 1024 --accum 2" PROFILE_ITERS=4 STEPS=10 SHARES=50 bash bench/gpu_teraio.sh
# CALIBRATE=1 plans each share again with --calibrate from its run's report and runs that plan too.
set -u
OUT=${OUT:-/tmp/teraio-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_teraio.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v deepspeed) || exit 1
export PYTHONPATH=/tmp/site:$PWD
echo "date $(date -u +%FT%TZ) commit ${TERAIO_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, kvikio, kvikio.defaults as d; print('torch', torch.__version__, 'kvikio', kvikio.__version__, 'compat', d.is_compat_mode_preferred())"
if [[ -n ${GPU_TESTS:-} ]]; then  # the tests only a GPU can run (tests/test_gpu.py), about a minute
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15
fi
EX=teraio/examples/train_gpt.py
ARGS="--preset 1b --autocast bf16 --deterministic --steps ${STEPS:-6} --log-every 1 ${EXTRA_ARGS:-}"
SWAP=/tmp/teraio-swap
TMP=/tmp/teraio-losses; mkdir -p $TMP
step() { echo; echo "=== $1 ($(date -u +%T))"; }

step "plain, uncapped"
timeout 120 python3 $EX $ARGS --losses-out $TMP/plain.json
if [[ -n ${CHECK_PLAIN_TWICE:-} ]]; then
  timeout 120 python3 $EX $ARGS --losses-out $TMP/plain2.json
  cmp $TMP/plain.json $TMP/plain2.json && echo "plain runs identical" || echo "PLAIN RUNS DIFFER"
fi
step "profile"
timeout 150 python3 -m teraio profile -o "$TMP/trace_1b.msgpack" --warmup 2 --iterations ${PROFILE_ITERS:-2} -- python3 $EX $ARGS
python3 -m teraio inspect "$TMP/trace_1b.msgpack" --json > "$OUT/trace_stats.json" || exit 1
PEAK=$(python3 -c "import json; print(json.load(open('$OUT/trace_stats.json'))['peak_bytes'])")
for SHARE in ${SHARES:-50 75}; do
  step "plan at ${SHARE}% of the traced peak ($PEAK bytes)"
  # SSD rates: what the swap files achieved through KvikIO compat mode here (bench/README.md)
  python3 -m teraio plan "$TMP/trace_1b.msgpack" --gpu-mem $((PEAK * SHARE / 100)) --ssds 1 --ssd-read-gbps 0.65 \
      --ssd-write-gbps 0.5 --host-mem 64GiB --host-gbps 37 --pcie-gbps 55 --headroom 1GiB -o "$OUT/plan_$SHARE.json" \
      2>&1 | grep -E "entries|offloaded|iteration|stalls|peak|fit|teraio:"
  step "teraio run under the ${SHARE}% cap"
  timeout ${RUN_TIMEOUT:-150} python3 -m teraio run --plan "$OUT/plan_$SHARE.json" --ssd-dir $SWAP \
      --report "$OUT/run_$SHARE.json" -- python3 $EX $ARGS --losses-out $TMP/run_$SHARE.json
  step "twin-run check, ${SHARE}%"
  python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); print(\"plain  \", a); print(\"teraio \", b)" $TMP/plain.json $TMP/run_$SHARE.json
  cmp $TMP/plain.json $TMP/run_$SHARE.json && echo "losses identical" || echo "LOSSES DIFFER"
  python3 -m teraio inspect "$OUT/run_$SHARE.json" 2>&1 | tail -25
  if [[ -n ${CALIBRATE:-} ]]; then  # issue 16: plan again from what that run measured, run it, compare
    step "calibrated plan at ${SHARE}% and its run"
    python3 -m teraio plan "$TMP/trace_1b.msgpack" --gpu-mem $((PEAK * SHARE / 100)) --ssds 1 --ssd-read-gbps 0.65 \
        --ssd-write-gbps 0.5 --host-mem 64GiB --host-gbps 37 --pcie-gbps 55 --headroom 1GiB \
        --calibrate "$OUT/run_$SHARE.json" -o "$OUT/plan_${SHARE}_cal.json" 2>&1 | grep -E "offloaded|iteration|measured|teraio:"
    timeout ${RUN_TIMEOUT:-150} python3 -m teraio run --plan "$OUT/plan_${SHARE}_cal.json" --ssd-dir $SWAP \
        --report "$OUT/run_${SHARE}_cal.json" -- python3 $EX $ARGS --losses-out $TMP/run_${SHARE}_cal.json 2>&1 | tail -3
    cmp $TMP/plain.json $TMP/run_${SHARE}_cal.json && echo "losses identical" || echo "LOSSES DIFFER"
    python3 -m teraio inspect "$OUT/run_${SHARE}_cal.json" 2>&1 | grep -A1 "measured vs"
  fi
done
