#!/usr/bin/env bash
# Issues 15/16 on the H200, one device call (carry [".whl"]): the 3B fp32 chained plan
# (docs/planner.md, Recomputation) for each CAP:HOST_MEM:HEADROOM in $PLANS (default: 1/2 of the
# peak with 1 and 2 GiB of headroom), each run under bench/run_baseline.py with 2 warm-up and
# 4 measured steps; one result line per plan in $OUT/chained_3b.jsonl. bench/recorded_fidelity.py
# then calibrates from the first line and predicts the others without a GPU. 1/4 of the peak:
# PLANS="41756124416:56GiB:1GiB 20878062208:64GiB:1GiB". The bf16 autocast job, with its ideal
# (no cap) measured first in the same call: DTYPE=bf16 IDEAL=1 PLANS="36293835624:56GiB:1GiB ..."
# (its trace traces/h200-3b-bf16-writes.msgpack, peak 72,587,671,248 bytes).
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
DTYPE=${DTYPE:-fp32}
if [[ -n ${IDEAL:-} ]]; then
  timeout 120 python3 bench/run_baseline.py --system ideal --preset 3b --dtype $DTYPE --warmup 2 --steps 4 \
      --label "ideal" --out $OUT/chained_3b.jsonl 2>&1 | grep "\[bench\]"
fi
for P in ${PLANS:-41756124416:56GiB:1GiB 41756124416:56GiB:2GiB}; do
  IFS=: read -r CAP HOST H <<< "$P"
  python3 -m teraio plan traces/h200-3b-$DTYPE-writes.msgpack --gpu-mem $CAP --ssds 0 --host-mem $HOST \
      --host-gbps 37 --pcie-gbps 55 --headroom $H -o /tmp/p3b.json > /dev/null
  timeout 200 python3 bench/run_baseline.py --system teraio_host --preset 3b --dtype $DTYPE --warmup 2 --steps 4 \
      --gpu-mem $CAP --plan /tmp/p3b.json --label "chained, cap $CAP, headroom $H" --out $OUT/chained_3b.jsonl 2>&1 | grep "\[bench\]"
done
