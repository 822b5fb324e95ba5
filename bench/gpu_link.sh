#!/usr/bin/env bash
# The link model on the H200, one device call (carry [".whl"]): bench/link_probe.py (one way
# alone, both ways at once), then two jobs each planned twice, run one after the other:
#   the short-kernel 1B fp32 (batch 4 x 64, profiled here, host plan at 1/2 of its peak), and
#   the 3B fp32 at 1/2 of its peak from traces/h200-3b-fp32-writes.msgpack,
# with the rates the recorded runs used (--host-gbps 37 --pcie-gbps 55, full duplex) and with
# one shared link at the probe's figures (--host-gbps <one way> --pcie-gbps <one way>
# --link-total-gbps <both together>). Result lines: $OUT/link_small.jsonl, $OUT/link_3b.jsonl
# (each with predicted_step_ms); plans kept in $OUT/plans/.
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
mkdir -p $OUT/plans
echo "date $(date -u +%FT%TZ) commit $TERAIO_COMMIT"
timeout 120 python3 bench/link_probe.py --gib 4 --chunk-mib 4 64 --rounds 5 --out $OUT/link_probe.json
read ONE BOTH < <(python3 -c "import json;r=json.load(open('$OUT/link_probe.json'))[-1]['gbps_median'];print(round(min(r['d2h_alone'],r['h2d_alone']),1), round(r['both_total'],1))")
SHARED=(--host-gbps $ONE --pcie-gbps $ONE --link-total-gbps $BOTH)
[[ $(python3 -c "print($BOTH < 2 * $ONE * 0.95)") == True ]] || SHARED=(--host-gbps $ONE --pcie-gbps $ONE)
echo "one way $ONE GB/s, both together $BOTH GB/s: shared plan options ${SHARED[*]}"
JOB=(--preset 1b --batch 4 --seq 64 --dtype fp32)
timeout 200 python3 bench/run_baseline.py --system ideal "${JOB[@]}" --warmup 2 --steps 3 \
    --profile-trace /tmp/small.msgpack > /dev/null 2>&1
timeout 200 python3 bench/run_baseline.py --system ideal "${JOB[@]}" --warmup 2 --steps 5 \
    --label "small, plain" --out $OUT/link_small.jsonl 2>&1 | grep "\[bench\]"
cp /tmp/small.msgpack $OUT/plans/
PEAK=$(python3 -m teraio inspect /tmp/small.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
run_pair() {  # NAME TRACE CAP HOST_MEM RESULTS BASELINE_ARGS...
  local name=$1 trace=$2 cap=$3 host=$4 results=$5; shift 5
  for V in recorded shared; do
    local rates=(--host-gbps 37 --pcie-gbps 55); [[ $V == shared ]] && rates=("${SHARED[@]}")
    python3 -m teraio plan $trace --gpu-mem $cap --ssds 0 --host-mem $host "${rates[@]}" --headroom 1GiB \
        -o $OUT/plans/$name-$V.json | grep -E "iteration|recomputed|offloaded"
    timeout 240 python3 bench/run_baseline.py --system teraio_host "$@" --warmup 2 --steps 5 --gpu-mem $cap \
        --plan $OUT/plans/$name-$V.json --label "$name, $V rates: ${rates[*]}" --out $results 2>&1 | grep "\[bench\]"
  done
}
run_pair small /tmp/small.msgpack $((PEAK / 2)) 32GiB $OUT/link_small.jsonl "${JOB[@]}"
run_pair 3b traces/h200-3b-fp32-writes.msgpack 41756124416 56GiB $OUT/link_3b.jsonl --preset 3b --dtype fp32
