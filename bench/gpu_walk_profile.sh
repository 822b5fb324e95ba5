#!/usr/bin/env bash
# Issue 14 on the H200, one device call (carry [".whl"], which holds py-spy's wheel): where the
# job's thread spends plan-following steps, sampled by py-spy (bench/run_baseline.py --py-spy,
# read by bench/spy_summary.py), for two jobs the host cost paces: the 1B in bf16 at 1/2 of its
# traced peak and the 3B fp32 chained plan at 1/2 (bench/gpu_chained_3b.sh's first plan).
# CPROFILE=1 uses cProfile instead (it slows every Python call: shares, not times).
# Results: $OUT/{1b_bf16,3b_fp32}.{stacks,txt} and the runs' result lines in $OUT/runs.jsonl.
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown} PATH=/tmp/site/bin:$PATH
echo "date $(date -u +%FT%TZ) commit $TERAIO_COMMIT"
sample() {  # $1: name; the rest: run_baseline.py arguments
  local name=$1; shift
  if [[ -n ${CPROFILE:-} ]]; then
    timeout 400 python3 bench/run_baseline.py "$@" --cprofile /tmp/$name.prof --out $OUT/runs.jsonl 2>&1 | grep "\[bench\]"
    python3 -c "import pstats, sys; s = pstats.Stats('/tmp/$name.prof', stream=sys.stdout); s.sort_stats('cumtime').print_stats(80)" > $OUT/$name.txt
  else
    timeout 400 python3 bench/run_baseline.py "$@" --py-spy $OUT/$name.stacks --out $OUT/runs.jsonl 2>&1 | grep -E "\[bench\]|py-spy> (Wrote|Error)"
    python3 bench/spy_summary.py $OUT/$name.stacks --top 70 > $OUT/$name.txt
  fi
  head -60 $OUT/$name.txt
}
timeout 200 python3 bench/run_baseline.py --system ideal --preset 1b --dtype bf16 --warmup 2 --steps 3 \
    --profile-trace /tmp/t1b.msgpack > /dev/null 2>&1
PEAK=$(python3 -m teraio inspect /tmp/t1b.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
python3 -m teraio plan /tmp/t1b.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem 64GiB --host-gbps 37 --pcie-gbps 55 \
    --headroom 1GiB -o /tmp/p1b.json > /dev/null
sample 1b_bf16 --system teraio_host --preset 1b --dtype bf16 --warmup 2 --steps 4 --gpu-mem $((PEAK / 2)) --plan /tmp/p1b.json
if [[ -z ${SKIP_3B:-} ]]; then
  python3 -m teraio plan traces/h200-3b-fp32-writes.msgpack --gpu-mem 41756124416 --ssds 0 --host-mem 56GiB \
      --host-gbps 37 --pcie-gbps 55 --headroom 1GiB -o /tmp/p3b.json > /dev/null
  sample 3b_fp32 --system teraio_host --preset 3b --dtype fp32 --warmup 2 --steps 4 --gpu-mem 41756124416 --plan /tmp/p3b.json
fi
