#!/usr/bin/env bash
# Issue 14 on the H200, one device call (carry [".whl"]): the per-copy host cost by part
# (bench/copy_issue_cost.py, with the C++ floor) and where the job's thread spends the
# plan-following steps of a short-kernel job (the 1B fp32 at batch 4 x 64, host-only plan at
# 1/2 of its traced peak: bench/fidelity.py's small-batch configuration), sampled by py-spy.
# Results: $OUT/copy_issue.json, $OUT/small_batch.{stacks,txt}, $OUT/runs.jsonl.
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown} PATH=/tmp/site/bin:$PATH
echo "date $(date -u +%FT%TZ) commit $TERAIO_COMMIT"
timeout 200 python3 bench/copy_issue_cost.py --cpp --out $OUT/copy_issue.json 2>&1 | tail -20
JOB=(--preset 1b --batch 4 --seq 64 --dtype fp32)
timeout 200 python3 bench/run_baseline.py --system ideal "${JOB[@]}" --warmup 2 --steps 3 \
    --profile-trace /tmp/small.msgpack > /dev/null 2>&1
PEAK=$(python3 -m teraio inspect /tmp/small.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
python3 -m teraio plan /tmp/small.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem 32GiB --host-gbps 37 --pcie-gbps 55 \
    --headroom 1GiB -o /tmp/small.json > /dev/null
timeout 200 python3 bench/run_baseline.py --system ideal "${JOB[@]}" --warmup 2 --steps 5 --out $OUT/runs.jsonl 2>&1 | grep "\[bench\]"
timeout 300 python3 bench/run_baseline.py --system teraio_host "${JOB[@]}" --warmup 2 --steps 5 --gpu-mem $((PEAK / 2)) \
    --plan /tmp/small.json --py-spy $OUT/small_batch.stacks --out $OUT/runs.jsonl 2>&1 | grep -E "\[bench\]|py-spy> (Wrote|Error)"
python3 bench/spy_summary.py $OUT/small_batch.stacks --top 90 > $OUT/small_batch.txt
head -100 $OUT/small_batch.txt
