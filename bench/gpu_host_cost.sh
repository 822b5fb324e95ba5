#!/usr/bin/env bash
# Issue 14 on the H200, one device call (carry [".whl"]): bench/host_cost.py on the 1B example,
# then a planned run of the same job at half its peak under cProfile ($OUT/cprofile_1b_planned.txt).
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
timeout 250 python3 bench/host_cost.py --device cuda --preset 1b --steps 8 --out $OUT/host_cost_cuda.json 2>&1 | tail -9
timeout 100 python3 bench/run_baseline.py --system ideal --preset 1b --dtype fp32 --warmup 2 --steps 3 --profile-trace /tmp/t1b.msgpack > /dev/null 2>&1
PEAK=$(python3 -m teraio inspect /tmp/t1b.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
python3 -m teraio plan /tmp/t1b.msgpack --gpu-mem $((PEAK/2)) --ssds 0 --host-mem 64GiB --host-gbps 37 --pcie-gbps 55 --headroom 1GiB -o /tmp/p1b.json > /dev/null
timeout 120 python3 bench/run_baseline.py --system teraio_host --preset 1b --dtype fp32 --warmup 2 --steps 4 --gpu-mem $((PEAK/2)) --plan /tmp/p1b.json --cprofile /tmp/h.prof --out $OUT/prof.jsonl 2>&1 | tail -2
python3 -c "import pstats, sys; s = pstats.Stats('/tmp/h.prof', stream=sys.stdout); s.sort_stats('tottime').print_stats(45); s.sort_stats('cumtime').print_stats(60)" > $OUT/cprofile_1b_planned.txt 2>&1; head -70 $OUT/cprofile_1b_planned.txt | tail -55
