#!/usr/bin/env bash
# Issue 12 on nvidia-h200-x2, in ONE device call (<= 10 min): the 1B example (bf16 autocast,
# fused AdamW, deterministic kernels) sharded with FSDP2 (fully_shard per decoder layer and on
# the root) on 2 GPUs: plain and uncapped, profiled (one trace per rank), planned per rank at
# $SHARE% (default 50) of the larger rank's traced peak, and run under that cap; losses
# compared bit for bit, and the bytes each rank moved per tensor kind (parameter shards,
# gradients, optimizer state, activations) printed from its report. Results land flat in
# $OUT: the log, per-rank trace stats and reports, and the traces and plans in
# traces_plans.tgz.
# Device tool: kind nvidia-h200-x2, carry [".whl"], command
#   TERAIO_COMMIT=<sha> bash bench/gpu_fsdp2.sh
set -u
# NVLink multicast stays off (device/KINDS.md): it can take the shared host's GPUs down.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/teraio-fsdp2}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_fsdp2.log") 2>&1
if [[ -z ${SKIP_INSTALL:-} ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $(ls .whl/*.whl | grep -v deepspeed) || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
echo "date $(date -u +%FT%TZ) commit ${TERAIO_COMMIT:-unknown}"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null
EX=teraio/examples/train_gpt.py
# MODEL_ARGS and SKIP_INSTALL exist for a CPU smoke test of this script (gloo, tiny preset).
ARGS="${MODEL_ARGS:-"--preset 1b --autocast bf16 --deterministic --steps 10 --log-every 1"} --fsdp2"
TR="torchrun --standalone --nproc-per-node 2"
TMP=/tmp/teraio-fsdp2-work; rm -rf $TMP; mkdir -p $TMP
step() { echo; echo "=== $1 ($(date -u +%T))"; }

step "plain FSDP2, uncapped"
timeout 180 $TR $EX $ARGS --losses-out $TMP/plain.json || exit 1
step "profile, one trace per rank"
timeout 240 python3 -m teraio profile -o $TMP/t.msgpack --warmup 2 --iterations 2 -- $TR $EX $ARGS || exit 1
for r in 0 1; do
  python3 -m teraio inspect $TMP/t.rank$r.msgpack --json > "$OUT/trace_stats.rank$r.json" || exit 1
done
python3 - $TMP/t.rank0.msgpack <<'PY'
import collections, sys
from teraio.formats.trace import Kind, load_trace
t = load_trace(sys.argv[1])
ops = collections.Counter(t.op_name(k) for k in range(t.num_kernels))
print("collectives the walk saw per iteration (rank 0):",
      {n: c for n, c in ops.items() if n in ("_allgather_base_", "_reduce_scatter_base_", "all_gather_copy_in", "allreduce_")})
by_kind = collections.Counter()
for i in range(t.num_tensors):
    by_kind[Kind(t.kind[i]).name] += int(t.nbytes[i])
print("traced bytes per kind (rank 0):", dict(by_kind))
PY
PEAK=$(python3 -c "import json; print(max(json.load(open('$OUT/trace_stats.rank%d.json' % r))['peak_bytes'] for r in (0, 1)))")
SHARE=${SHARE:-50}
step "plan each rank at ${SHARE}% of the larger traced peak ($PEAK bytes)"
python3 -m teraio plan $TMP/t.rank0.msgpack $TMP/t.rank1.msgpack --gpu-mem $((PEAK * SHARE / 100)) --ssds 1 \
    --ssd-read-gbps 0.65 --ssd-write-gbps 0.5 --host-mem ${HOST_MEM:-48GiB} --host-gbps 37 --pcie-gbps 55 \
    --headroom ${HEADROOM:-1GiB} || exit 1
# one file for both ranks' traces and plans ($OUT returns at most 8 files)
tar czf "$OUT/traces_plans.tgz" -C $TMP t.rank0.msgpack t.rank1.msgpack t.plan.rank0.json t.plan.rank1.json
step "teraio run under the cap, 2 ranks"
timeout ${RUN_TIMEOUT:-240} python3 -m teraio run --plan $TMP/t.plan.json --ssd-dir /tmp/teraio-swap \
    --report "$OUT/run.json" -- $TR $EX $ARGS --losses-out $TMP/run.json
echo "teraio run exited $?"
step "what moved, per rank"
for r in 0 1; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('rank', sys.argv[2], 'on plan', d['iterations_on_plan'], 'of', d['iterations'], 'peak', d['peak_device_bytes'], 'budget', d['budget_bytes'], 'moved by kind', d.get('offloaded_bytes_by_kind'), 'skipped', d['skipped_actions'], 'evictions', d['on_demand_evictions'])" "$OUT/run.rank$r.json" $r
done
step "twin-run check"
python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); print('plain  ', a); print('teraio ', b)" $TMP/plain.json $TMP/run.json
cmp $TMP/plain.json $TMP/run.json && echo "losses identical" || echo "LOSSES DIFFER"
