#!/usr/bin/env bash
# Two runtimes side by side on the LoRA case of bench/gpu_lora.sh, in one device call (~6 min):
# the tree's and an older commit's packages extracted into oldab/ (untracked, it travels):
#   rm -rf oldab && mkdir oldab && git archive <old sha> teraio teraio_run teraio_profile teraio_plan | tar -x -C oldab
#   device: TERAIO_COMMIT=<sha> OLD_COMMIT=<old sha> bash bench/gpu_lora_ab.sh   (carry [".whl"], py-spy in it)
# RUNS="new old new old" picks the runs (default: new old new spy); a run named oldplan is the
# tree's runtime under the plan the old commit's planner makes of the same trace and budget
# (RUNS="new oldplan new oldplan": two planners side by side); CALIBRATE=1 then plans
# again from run 1's report with the tree's planner and runs that plan with the tree's runtime.
# Plain and uncapped once, profiled and planned (host tier, 1/2 of the traced peak) by the tree,
# then run under that plan by new, old, new runtimes (losses compared with the plain run's each
# time), and once more by the new one under py-spy: where the job's thread spends a planned
# run (bench/spy_summary.py, samples inside the script's main, model build included).
# On the CPU box, to try it (py-spy aside): SIZE="--device cpu --seq 32 --hidden 128 --layers 2 --vocab 512" HEADROOM=0 HOST_MEM=4GiB.
set -u
OUT=${OUT:-/tmp/teraio-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_lora_ab.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v deepspeed) || exit 1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PATH=/tmp/site/bin:$PATH
NEW=$PWD; OLD=$PWD/oldab
echo "date $(date -u +%FT%TZ) new ${TERAIO_COMMIT:-unknown} old ${OLD_COMMIT:-unknown} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
JOB="python3 $NEW/tests/clients/hf_llama.py --lora --accum 4 --batch 4 --steps ${STEPS:-8} \
${SIZE:---device cuda --seq 512 --hidden 2048 --layers 16 --vocab 32000}"
TMP=/tmp/teraio-lora; mkdir -p $TMP
step() { echo; echo "=== $1 ($(date -u +%T))"; }
export PYTHONPATH=/tmp/site:$NEW

step "plain, uncapped"
timeout 150 $JOB --losses-out $TMP/plain.json --step-ms-out "$OUT/plain_step_ms.json" > /dev/null 2>&1 || exit 1
python3 -c "import json,statistics,sys; t=json.load(open(sys.argv[1])); print('plain steps ms:', [round(x, 1) for x in t], 'median after the first two', round(statistics.median(t[2:]), 1))" "$OUT/plain_step_ms.json"
step "profile and plan (new)"
timeout 200 python3 -m teraio profile -o $TMP/lora.msgpack -- $JOB > /dev/null 2>&1 || exit 1
PEAK=$(python3 -m teraio inspect $TMP/lora.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
python3 -m teraio plan $TMP/lora.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem ${HOST_MEM:-64GiB} --host-gbps 37 \
    --pcie-gbps 55 --headroom ${HEADROOM:-1GiB} -o "$OUT/plan_lora.json" > /dev/null || exit 1
if [[ " ${RUNS:-} " == *" oldplan "* ]]; then
  (cd $OLD && PYTHONPATH=/tmp/site:$OLD python3 -m teraio plan $TMP/lora.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 \
      --host-mem ${HOST_MEM:-64GiB} --host-gbps 37 --pcie-gbps 55 --headroom ${HEADROOM:-1GiB} \
      -o "$OUT/plan_lora_oldplanner.json" > /dev/null) || exit 1
  python3 - "$OUT/plan_lora.json" "$OUT/plan_lora_oldplanner.json" <<'EOF'
import sys
from teraio.formats.plan import load_plan
from teraio_plan.make import copies_per_iteration
for name, path in zip(("new planner", "old planner"), sys.argv[1:]):
    p = load_plan(path)
    print(f"{name}: {len(p.entries)} entries, {copies_per_iteration(p.entries)} copies per iteration, "
          f"predicted {p.header.prediction.iteration_ms:.1f} ms, fits {p.header.prediction.fits}")
EOF
fi

summary() {  # one line per run: planned iterations' ms and walk + agent us per kernel, medians
  python3 - "$1" "$2" <<'EOF'
import json, statistics as st, sys
run = json.load(open(sys.argv[1]))
rows = [r for r in run["per_iteration"] if r["followed_plan"]][1:]   # the first planned one warms up
med = lambda key: st.median(r[key] for r in rows)
print(f"{sys.argv[2]}: {run['iterations_on_plan']} of {run['iterations']} on plan; planned ms "
      f"{[round(r['ms']) for r in rows]} median {med('ms'):.1f}; walk+agent {med('walk_ms'):.1f} ms "
      f"({1e3 * med('walk_ms') / rows[0]['kernels']:.1f} us/kernel), copies {med('copies_issued'):.0f} in "
      f"{med('copy_issue_ms'):.1f} ms, stalls {med('stall_ms'):.1f} ms, evictions {sum(r['evictions'] for r in rows)}")
EOF
}
n=0
for V in ${RUNS:-new old new spy}; do
  n=$((n + 1)); D=$([[ $V == old ]] && echo $OLD || echo $NEW)
  PLAN="$OUT/plan_lora.json"; [[ $V == oldplan ]] && PLAN="$OUT/plan_lora_oldplanner.json"
  step "run $n: $V"
  SPY=(); [[ $V == spy ]] && SPY=(py-spy record --rate 200 --idle --subprocesses --format raw -o "$OUT/lora_planned.stacks" --)
  (cd $D && PYTHONPATH=/tmp/site:$D timeout 240 "${SPY[@]}" python3 -m teraio run --plan "$PLAN" \
      --report "$OUT/run_${n}_$V.json" -- $JOB --losses-out $TMP/run_$n.json > $TMP/run_$n.log 2>&1) || { tail -5 $TMP/run_$n.log; continue; }
  cmp -s $TMP/plain.json $TMP/run_$n.json && echo "losses identical" || echo "LOSSES DIFFER"
  summary "$OUT/run_${n}_$V.json" "$V"
done
if [[ -n ${CALIBRATE:-} ]]; then   # the new planner, calibrated from run 1, and the new runtime under its plan
  step "plan again from run 1's report (new) and run it"
  python3 -m teraio plan $TMP/lora.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem ${HOST_MEM:-64GiB} --host-gbps 37 \
      --pcie-gbps 55 --headroom ${HEADROOM:-1GiB} --calibrate $OUT/run_1_*.json -o "$OUT/plan_lora_cal.json" > /dev/null || exit 1
  timeout 240 python3 -m teraio run --plan "$OUT/plan_lora_cal.json" --report "$OUT/run_cal_new.json" \
      -- $JOB --losses-out $TMP/run_cal.json > $TMP/run_cal.log 2>&1 || { tail -5 $TMP/run_cal.log; exit 1; }
  cmp -s $TMP/plain.json $TMP/run_cal.json && echo "losses identical" || echo "LOSSES DIFFER"
  summary "$OUT/run_cal_new.json" "calibrated plan, new"
  python3 - "$OUT/plan_lora.json" "$OUT/plan_lora_cal.json" "$OUT/run_cal_new.json" <<'EOF'
import json, sys
from teraio.formats.plan import load_plan
from teraio_plan.make import copies_per_iteration
plan, cal = (load_plan(p) for p in sys.argv[1:3])
run = json.load(open(sys.argv[3]))
for name, p in (("plan", plan), ("calibrated plan", cal)):
    replays = sum(e.tier == "recompute" for e in p.entries)
    print(f"{name}: {replays} replays, {copies_per_iteration(p.entries)} copies per iteration, predicted "
          f"{p.header.prediction.iteration_ms:.1f} ms")
print(f"calibrated: measured {run['measured_iteration_ms']:.1f} ms "
      f"({cal.header.prediction.iteration_ms / run['measured_iteration_ms'] - 1:+.1%} predicted)")
EOF
fi
if [[ -s $OUT/lora_planned.stacks ]]; then
  python3 bench/spy_summary.py "$OUT/lora_planned.stacks" --inside "main (hf_llama.py)" --top 70 > "$OUT/lora_planned.txt"
  head -75 "$OUT/lora_planned.txt"; echo ...; sed -n '/self %/,$p' "$OUT/lora_planned.txt"
fi
