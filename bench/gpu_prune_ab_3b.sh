#!/usr/bin/env bash
# Note [Pruning the fill] (teraio_plan/make.py) on the GPU, one device call (carry [".whl"]): the
# 3B fp32 at 1/4 of its peak (host tier, chained replays) planned twice from the committed trace,
# with the fill pruning ("pruned", the planner as it is) and without it ("whole": _prune_fill
# switched off), then each plan run by the same runtime in the order of $RUNS (default
# "pruned whole pruned whole"), 2 warm-up and 4 measured steps each; one result line per run in
# $OUT/prune_ab_3b.jsonl (the run report inside it), the two plans beside it. A run is not started
# once fewer than 150 s of the call's $BUDGET_S (default 560) are left.
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
CAP=20878062208
ARGS="traces/h200-3b-fp32-writes.msgpack --gpu-mem $CAP --ssds 0 --host-mem 64GiB --host-gbps 37 --pcie-gbps 55 --headroom 1GiB"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m teraio plan $ARGS -o $OUT/plan_pruned.json > /dev/null
python3 -c "
import sys, teraio_plan.make as make
make._prune_fill = lambda *args: args[-1]   # the replay's best plan, as before the pruning
from teraio.app.cli import main
sys.argv = ['teraio', 'plan', *sys.argv[1:]]
main()" $ARGS -o $OUT/plan_whole.json > /dev/null
python3 -c "
import json, sys
for v in ('pruned', 'whole'):
    plan = json.load(open(f'$OUT/plan_{v}.json'))
    print(v, len(plan['entries']), 'entries', file=sys.stderr)"
N=0
for V in ${RUNS:-pruned whole pruned whole}; do
  N=$((N + 1))
  if (( SECONDS > ${BUDGET_S:-560} - 150 )); then echo "skipped run $N ($V): ${SECONDS}s spent"; continue; fi
  timeout 240 python3 bench/run_baseline.py --system teraio_host --preset 3b \
      --dtype fp32 --warmup 2 --steps 4 --gpu-mem $CAP --plan $OUT/plan_$V.json --label "$V, run $N" \
      --out $OUT/prune_ab_3b.jsonl 2>&1 | grep "\[bench\]"
done
