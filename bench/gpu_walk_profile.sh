#!/usr/bin/env bash
# Issue 14 on the H200, one device call (carry [".whl"]): where the training thread's host time
# goes in plan-following iterations, by cProfile, for two jobs the host cost paces:
#  - the 1B example in bf16 (bench/gpu_teraio.sh's job) under a plan at 1/2 of its traced peak;
#  - the 3B fp32 chained plan at 1/2 (bench/gpu_chained_3b.sh's first plan).
# cProfile slows Python code: the stats say where time goes, not how long a step takes.
# Results: $OUT/cprofile_{1b_bf16,3b_fp32}.txt (tottime, then cumtime), the runs' reports.
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
echo "date $(date -u +%FT%TZ) commit $TERAIO_COMMIT"
stats() {  # $1: stats file, $2: text out
  python3 -c "import pstats, sys; s = pstats.Stats('$1', stream=sys.stdout); s.sort_stats('tottime').print_stats(50); s.sort_stats('cumtime').print_stats(70)" > "$2" 2>&1
  head -75 "$2" | tail -60
}
EX=teraio/examples/train_gpt.py
ARGS="--preset 1b --autocast bf16 --deterministic --steps 8 --log-every 1"
timeout 150 python3 -m teraio profile -o /tmp/t1b.msgpack --warmup 2 --iterations 2 -- python3 $EX $ARGS > /dev/null 2>&1
PEAK=$(python3 -m teraio inspect /tmp/t1b.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
python3 -m teraio plan /tmp/t1b.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem 64GiB --host-gbps 37 --pcie-gbps 55 \
    --headroom 1GiB -o /tmp/p1b.json > /dev/null
timeout 200 python3 -m teraio run --plan /tmp/p1b.json --report $OUT/run_1b_bf16.json -- \
    python3 -m cProfile -o /tmp/p1b.prof $EX $ARGS 2>&1 | grep -E "^done|iteration .* measured|last planned|host time"
stats /tmp/p1b.prof $OUT/cprofile_1b_bf16.txt
if [[ -z ${SKIP_3B:-} ]]; then
  python3 -m teraio plan traces/h200-3b-fp32-writes.msgpack --gpu-mem 41756124416 --ssds 0 --host-mem 56GiB \
      --host-gbps 37 --pcie-gbps 55 --headroom 1GiB -o /tmp/p3b.json > /dev/null
  timeout 300 python3 bench/run_baseline.py --system teraio_host --preset 3b --dtype fp32 --warmup 2 --steps 4 \
      --gpu-mem 41756124416 --plan /tmp/p3b.json --cprofile /tmp/p3b.prof --out $OUT/chained_3b.jsonl 2>&1 | grep "\[bench\]"
  stats /tmp/p3b.prof $OUT/cprofile_3b_fp32.txt
fi
