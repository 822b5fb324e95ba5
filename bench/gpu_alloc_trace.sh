#!/usr/bin/env bash
# Issue 14 on the H200, one device call (carry [".whl"]): the 3B fp32 chained plan at 1/2 (as in
# docs/runtime.md, Re-allocation at the cap), run with the CUDA allocator's history recorded over
# one step after the measured ones; bench/alloc_trace.py says which allocations mapped memory,
# who asked for them, and how often the allocator flushed. Results: $OUT/alloc_trace.{jsonl,json,txt}.
# ALLOC_CONF sets PYTORCH_CUDA_ALLOC_CONF for the run (default: what teraio run sets).
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
CAP=41756124416
python3 -m teraio plan traces/h200-3b-fp32-writes.msgpack --gpu-mem $CAP --ssds 0 --host-mem 56GiB \
    --host-gbps 37 --pcie-gbps 55 --headroom 1GiB -o /tmp/p3b.json > /dev/null
${ALLOC_CONF:+env PYTORCH_CUDA_ALLOC_CONF=$ALLOC_CONF} timeout 300 python3 bench/run_baseline.py --system teraio_host \
    --preset 3b --dtype fp32 --warmup 2 --steps 3 --gpu-mem $CAP --plan /tmp/p3b.json \
    --memory-history /tmp/alloc.pickle --label "alloc trace ${ALLOC_CONF:-default}" --out $OUT/alloc_trace.jsonl 2>&1 | tail -3
python3 bench/alloc_trace.py /tmp/alloc.pickle --json $OUT/alloc_trace.json | tee $OUT/alloc_trace.txt
gzip -c /tmp/alloc.pickle > /tmp/alloc.pickle.gz; [ $(stat -c %s /tmp/alloc.pickle.gz) -lt 60000000 ] && cp /tmp/alloc.pickle.gz $OUT/
