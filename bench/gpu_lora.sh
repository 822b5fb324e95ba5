#!/usr/bin/env bash
# Issue 15's LoRA case on the H200, in one device call (about 4 min): a transformers Llama of
# ~1B parameters (hidden 2048, 16 layers, vocab 32000, fp32) with peft LoRA adapters on its
# frozen base, 4 micro-batches of 4 x 512 tokens per step, deterministic kernels
# (tests/clients/hf_llama.py). Plain and uncapped, then profiled, planned host-only at 1/2 of
# its traced peak and run under that cap; losses compared bit for bit, and the bytes written
# to the host pool against the bytes released from the device (target: at most half; a
# frozen weight's copy stays current, so its later releases write nothing).
# Device tool: carry [".whl"], command `TERAIO_COMMIT=<sha> bash bench/gpu_lora.sh`;
# GPU_TESTS=1 first runs tests/test_gpu.py; CALIBRATE=1 then plans again with the run's report
# (--calibrate) and runs that plan: issue 16's predicted against measured. Results land flat in $OUT.
# On the CPU box, to try the script: SIZE="--device cpu --seq 32 --hidden 128 --layers 2 --vocab 512" (and
# python3 with teraio importable, HEADROOM=0 HOST_MEM=4GiB).
set -u
OUT=${OUT:-/tmp/teraio-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_lora.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v deepspeed) || exit 1
export PYTHONPATH=/tmp/site:$PWD CUBLAS_WORKSPACE_CONFIG=:4096:8
echo "date $(date -u +%FT%TZ) commit ${TERAIO_COMMIT:-unknown}"
if [[ -n ${GPU_TESTS:-} ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15
fi
JOB="python3 tests/clients/hf_llama.py --lora --accum 4 --batch 4 --steps ${STEPS:-8} \
${SIZE:---device cuda --seq 512 --hidden 2048 --layers 16 --vocab 32000}"
TMP=/tmp/teraio-lora; mkdir -p $TMP
step() { echo; echo "=== $1 ($(date -u +%T))"; }

step "plain, uncapped"
time timeout 150 $JOB --losses-out $TMP/plain.json --step-ms-out "$OUT/plain_step_ms.json" || exit 1
python3 -c "import json,statistics,sys; t=json.load(open(sys.argv[1])); print('plain steps ms:', [round(x, 1) for x in t], 'median after the first two', round(statistics.median(t[2:]), 1))" "$OUT/plain_step_ms.json"
step "profile"
timeout 200 python3 -m teraio profile -o $TMP/lora.msgpack -- $JOB || exit 1
python3 -m teraio inspect $TMP/lora.msgpack --json > "$OUT/trace_stats_lora.json" || exit 1
cp $TMP/lora.msgpack "$OUT/trace_lora.msgpack"   # kept, so the recorded runs replay offline (bench/recorded_fidelity.py)
PEAK=$(python3 -c "import json; print(json.load(open('$OUT/trace_stats_lora.json'))['peak_bytes'])")
step "plan at 1/2 of the traced peak ($PEAK bytes), host tier only"
python3 -m teraio plan $TMP/lora.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem ${HOST_MEM:-64GiB} --host-gbps 37 \
    --pcie-gbps 55 --headroom ${HEADROOM:-1GiB} -o "$OUT/plan_lora.json" || exit 1
step "teraio run under the cap"
time timeout 200 python3 -m teraio run --plan "$OUT/plan_lora.json" \
    --report "$OUT/run_lora.json" -- $JOB --losses-out $TMP/run.json || exit 1
step "twin-run check"
python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); print('plain  ', a); print('teraio ', b)" \
    $TMP/plain.json $TMP/run.json
cmp $TMP/plain.json $TMP/run.json && echo "losses identical" || echo "LOSSES DIFFER"
step "bytes written against bytes released"
python3 - "$OUT/run_lora.json" "$OUT/plan_lora.json" <<'EOF'
import json, statistics, sys
run, plan = (json.load(open(p)) for p in sys.argv[1:])
released, written = run["offloaded_bytes"]["host"], run["written_bytes"]["host"]
pred = plan["header"]["prediction"]
planned = [row for row in run["per_iteration"] if row["followed_plan"]]
print(f"whole run ({run['iterations']} iterations, {run['iterations_on_plan']} on plan): released to the host "
      f"{released / 1e9:.2f} GB, written {written / 1e9:.2f} GB ({written / max(released, 1):.1%})")
print(f"plan per iteration: host {pred['offload_bytes_by_tier']['host'] / 1e9:.2f} GB offloaded, "
      f"{pred['clean_bytes_per_iteration'] / 1e9:.2f} GB of it clean; predicted {pred['iteration_ms']:.1f} ms")
print("planned iterations ms:", [round(row["ms"], 1) for row in planned],
      "median", round(statistics.median(row["ms"] for row in planned), 1) if planned else None)
print("evictions on plan:", sum(row["evictions"] for row in planned), "measured", run["measured_iteration_ms"])
EOF
python3 -m teraio inspect "$OUT/run_lora.json" 2>&1 | tail -22
if [[ -n ${CALIBRATE:-} ]]; then
  step "plan again, calibrated from that run, and run it"
  python3 -m teraio plan $TMP/lora.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem ${HOST_MEM:-64GiB} --host-gbps 37 \
      --pcie-gbps 55 --headroom ${HEADROOM:-1GiB} --calibrate "$OUT/run_lora.json" -o "$OUT/plan_lora_cal.json" || exit 1
  timeout 200 python3 -m teraio run --plan "$OUT/plan_lora_cal.json" --report "$OUT/run_lora_cal.json" \
      -- $JOB --losses-out $TMP/run_cal.json > /dev/null 2>&1 || exit 1
  cmp $TMP/plain.json $TMP/run_cal.json && echo "losses identical" || echo "LOSSES DIFFER"
  python3 - "$OUT/run_lora_cal.json" "$OUT/plan_lora_cal.json" <<'EOF'
import json, sys
run, plan = (json.load(open(p)) for p in sys.argv[1:])
predicted, measured = plan["header"]["prediction"]["iteration_ms"], run["measured_iteration_ms"]
print(f"calibrated: predicted {predicted:.1f} ms, measured {measured:.1f} ms ({predicted / measured - 1:+.1%}); "
      f"{run['iterations_on_plan']} of {run['iterations']} on plan, peak {run['peak_device_bytes']} of {run['budget_bytes']}")
print("planned iterations ms:", [round(row["ms"], 1) for row in run["per_iteration"] if row["followed_plan"]])
EOF
fi
