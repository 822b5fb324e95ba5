#!/usr/bin/env bash
# Issue 16's kernel times on the H200, one device call (carry [".whl"]): a trace's kernel time
# against the plain step, for a short-kernel job (the 1B fp32 at batch 4 x 64, profiled twice:
# two profiles of one job must agree) and for the GPU-bound 3B fp32 (profiled once), Note
# [Kernel time on a held stream] in teraio_profile/recorder.py. Then, with GPU_TESTS=1, the
# GPU tests and the 1B twin run at 1/2 (bench/gpu_teraio.sh). Results: $OUT/kernel_times.jsonl
# (plain steps), $OUT/kernel_times.txt (trace sums), the traces. SKIP_3B=1 leaves the 3B out.
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
echo "date $(date -u +%FT%TZ) commit $TERAIO_COMMIT" | tee $OUT/kernel_times.txt
sums() { python3 -c "
from teraio.formats.trace import load_trace
t = load_trace('$1'); print('$2: trace kernel time', round(float(t.duration_us.sum()) / 1e3, 1), 'ms over', t.num_kernels,
      'kernels; its iteration', round(t.header.iteration_ms, 1), 'ms')" | tee -a $OUT/kernel_times.txt; }
SMALL=(--preset 1b --batch 4 --seq 64 --dtype fp32)
timeout 200 python3 bench/run_baseline.py --system ideal "${SMALL[@]}" --warmup 2 --steps 5 --label "small, plain" \
    --out $OUT/kernel_times.jsonl 2>&1 | grep "\[bench\]" | tee -a $OUT/kernel_times.txt
for I in 1 2; do
  timeout 200 python3 bench/run_baseline.py --system ideal "${SMALL[@]}" --warmup 2 --steps 3 \
      --profile-trace $OUT/small_$I.msgpack > /dev/null 2>&1
  sums $OUT/small_$I.msgpack "small, profile $I"
done
if [[ -z ${SKIP_3B:-} ]]; then
timeout 200 python3 bench/run_baseline.py --system ideal --preset 3b --dtype fp32 --warmup 2 --steps 4 --label "3b, plain" \
    --out $OUT/kernel_times.jsonl 2>&1 | grep "\[bench\]" | tee -a $OUT/kernel_times.txt
timeout 240 python3 bench/run_baseline.py --system ideal --preset 3b --dtype fp32 --warmup 2 --steps 3 \
    --profile-trace $OUT/3b.msgpack > /dev/null 2>&1
sums $OUT/3b.msgpack "3b, profile"
fi
if [[ -n ${GPU_TESTS:-} ]]; then SHARES=50 bash bench/gpu_teraio.sh 2>&1 | grep -E "passed|failed|error|identical|DIFFER|Error" | head -20; fi
