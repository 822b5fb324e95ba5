#!/usr/bin/env bash
# Issue 5 baselines on the H200 in ONE device call (<= 10 min): a ~3B Llama-shaped model
# (preset 3b: 2.91B params, fp32 weights + AdamW, TF32 matmuls, batch 4 x seq 2048), first the
# ideal run uncapped, then every baseline capped at 1/2 and 1/4 of the ideal's peak (the model
# "needs 2x / 4x" the cap), 3 warm-up + 10 measured steps each. Results are appended, one JSON
# line per run, to $OUT/baselines.jsonl (a cut-off call still returns what finished); the log
# is $OUT/gpu_baselines.log. A run that does not fit the remaining time gets a "skipped" line.
#
# Device tool: carry [".whl"], timeout_s 600, command:
#   bash bench/gpu_baselines.sh              # ideal, ZeRO-Offload, checkpointing, save_on_cpu (+ extras)
#   IDEAL_PEAK=<bytes> bash bench/gpu_baselines.sh infinity    # ZeRO-Infinity alone at 2x (slow disk)
#   IDEAL_PEAK=<bytes> HOST_MEM=<size> bash bench/gpu_baselines.sh teraio   # teraio_host/mixed/ssd at 2x, 4x
#   MODEL_ARGS="--preset 3b --dtype bf16" bash bench/gpu_baselines.sh pair  # ideal, teraio_host, ZeRO-Offload+ckpt at 2x
#   bash bench/gpu_baselines.sh recompute    # ideal; teraio_host with and without recomputation, checkpointing at 2x
#   IDEAL_PEAK=<bytes> PROFILE_CAPS="1 2" bash bench/gpu_baselines.sh capped  # profiled under caps, planned and run at 2x
#     (REF_TRACE=<uncapped trace> compares a later call's traces with an earlier one's)
#   bash bench/gpu_baselines.sh bigbase      # ZeRO-Offload + checkpointing and ZeRO-Infinity on that model
#   bash bench/gpu_baselines.sh big          # the ~8B model that does not fit: plain, profiled under a cap, 2 plans
#     (BIG_DETERMINISTIC=1 BIG_STEPS=10 BIG_MIXED_STEPS=2: the losses compare;
#     the mixed plan's pool leaves BIG_DISK_GIB, default 4, for the disk unless BIG_MIXED_POOL is given)
# CAPS="2 4" and TIERS="host mixed ssd" (teraio) pick the rows. GPU_TESTS=1 (teraio, pair)
# first runs tests/test_gpu.py; PROFILE_RUN=1 (teraio) ends with a cProfile'd teraio_host run
# at 2x ($OUT/cprofile_host_2x.txt: where the host time goes).
# Then copy $OUT/baselines.jsonl into bench/results/ and run `python bench/report.py`.
set -u
START=$SECONDS
BUDGET=${BUDGET_S:-560}                 # seconds for the whole script (the call's limit is 600)
MODE=${1:-main}
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
RES=$OUT/baselines.jsonl
exec > >(tee -a "$OUT/gpu_baselines.log") 2>&1
if [[ -z ${SKIP_INSTALL:-} ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
echo "date $(date -u +%FT%TZ) mode $MODE commit $TERAIO_COMMIT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# DeepSpeed 0.19.8's JIT builder cannot parse arch names like the image's "9.0a" (async_io
# failed to build on 2026-11-29): name the device's own compute capability instead.
TORCH_CUDA_ARCH_LIST=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null) \
    && export TORCH_CUDA_ARCH_LIST || unset TORCH_CUDA_ARCH_LIST
# MODEL_ARGS / IDEAL_PEAK / SKIP_INSTALL exist for a CPU smoke test of this script's flow.
read -r -a MODEL <<< "${MODEL_ARGS:---preset 3b --dtype fp32 --warmup 3 --steps 10}"

left() { echo $((BUDGET - (SECONDS - START))); }
# run SYSTEM LIMIT_S [ARGS...]: one result line; skipped (not started) if time is short.
run() {
    local system=$1 limit=$2; shift 2
    local remain; remain=$(left)
    echo; echo "=== $system $* (at $((SECONDS - START)) s, $remain s left)"
    if (( remain < 45 )); then
        python3 bench/run_baseline.py --system "$system" "${MODEL[@]}" "$@" --out "$RES" \
            --skip "not run: the device call's time ran out ($remain s left)"
        return
    fi
    (( limit > remain - 10 )) && limit=$((remain - 10))
    python3 bench/run_baseline.py --system "$system" "${MODEL[@]}" "$@" --timeout-s "$limit" --out "$RES"
}
# The last ok ideal's peak device bytes in $RES, or nothing.
ideal_peak() {
    python3 - "$RES" <<'PY'
import json, sys
ok = [r for r in map(json.loads, open(sys.argv[1])) if r["system"] == "ideal" and r["status"] == "ok"]
print((ok[-1]["metrics"]["peak_device_bytes"] or "") if ok else "")
PY
}
# DeepSpeed's ops compile on first use: build cpu_adam now, so no measured run pays for it.
build_ops() {
    echo; echo "=== building DeepSpeed ops: $*"
    timeout 240 python3 -c "import sys, deepspeed.ops.op_builder as b; [getattr(b, n)().load() for n in sys.argv[1:]]" "$@" \
        || echo "op build failed: the DeepSpeed runs will fail and say why"
}

# teraio_rows PEAK TIERS...: TeraIO on the same model, loop, caps and seed: profile the ideal
# loop once, plan per cap (PEAK / each ratio in CAPS) and tier set, run each plan. HOST_MEM is
# ZeRO-Offload's host footprint (teraio_mixed gets the same); teraio_host gets HOST_ONLY_MEM.
# SSD-only runs whose plan predicts more than SSD_MAX_STEP_S per step are written as skipped
# with the prediction (one 1.5 GB/s disk).
# The SSD rates are what teraio's swap files achieved through KvikIO compat mode on this
# machine (report achieved_gbps, 2026-11-29: s2d 0.59-0.73, d2s 0.44-0.53 GB/s), not dd's.
LINK=(--ssd-read-gbps ${SSD_READ_GBPS:-0.65} --ssd-write-gbps ${SSD_WRITE_GBPS:-0.5} --host-gbps ${HOST_GBPS:-37}
      --pcie-gbps 55 --headroom ${HEADROOM:-1GiB})
declare -A TIER_ARGS=([host]="--ssds 0 --host-mem ${HOST_ONLY_MEM:-96GiB}"
                      [mixed]="--ssds 1 --host-mem ${HOST_MEM:-48GiB}" [ssd]="--ssds 1 --host-mem 0")
PLANS=/tmp/teraio-plans
teraio_rows() {
    local peak=$1; shift
    TRACE=/tmp/teraio-3b.msgpack
    mkdir -p $PLANS
    echo; echo "=== profile the ideal loop"
    timeout 300 python3 bench/run_baseline.py --system ideal "${MODEL[@]}" --profile-trace $TRACE || return 1
    python3 -m teraio inspect $TRACE --json > "$OUT/trace_stats.json"
    cp $TRACE "$OUT/"   # for replanning here
    local tier ratio
    for tier in "$@"; do
        read -r -a T <<< "${TIER_ARGS[$tier]}"
        for ratio in ${CAPS:-2 4}; do   # CAPS: which ratios (ideal peak / cap) to run
            teraio_row "$tier" $((peak / ratio)) "cap 1/$ratio of ideal peak" "$PLANS/plan_${tier}_${ratio}x.json"
        done
    done
}
# teraio_row TIER CAP LABEL PLAN (tier options in T): plan, then run or say why not.
teraio_row() {
    local tier=$1 cap=$2 label=$3 plan=$4
    python3 -m teraio plan $TRACE --gpu-mem "$cap" "${T[@]}" "${LINK[@]}" -o "$plan" --json > /tmp/plan.out 2>&1 \
        || { python3 bench/run_baseline.py --system "teraio_$tier" "${MODEL[@]}" --gpu-mem "$cap" \
                 --label "$label" --out "$RES" --skip "teraio plan failed: $(tail -1 /tmp/plan.out)"; return; }
    tar -czf "$OUT/plans.tgz" -C $PLANS .   # at most 8 files come back: the plans travel as one
    python3 -c "import json; p = json.load(open('$plan'))['header']['prediction']; print('$plan', {k: p[k] for k in \
        ('iteration_ms', 'ideal_iteration_ms', 'stall_ms', 'fits', 'peak_bytes', 'offload_bytes_by_tier', \
        'recompute_bytes_per_iteration', 'recompute_ms_per_iteration')})"
    local step_s
    step_s=$(python3 -c "import json; print(int(json.load(open('$plan'))['header']['prediction']['iteration_ms'] / 1e3))")
    if [[ $tier == ssd ]] && (( step_s > ${SSD_MAX_STEP_S:-20} )); then
        python3 bench/run_baseline.py --system teraio_ssd "${MODEL[@]}" --gpu-mem "$cap" --label "$label" \
            --plan "$plan" --out "$RES" --skip "not run: its plan predicts ${step_s} s per step (one 1.5 GB/s disk)"
        return
    fi
    run "teraio_$tier" ${TERAIO_RUN_S:-200} --gpu-mem "$cap" --label "$label" --plan "$plan"
}
# capped_rows PEAK: the ideal loop profiled under a cap of PEAK / each ratio in PROFILE_CAPS
# (1 = uncapped), each trace compared with REF_TRACE (the uncapped one) column by column,
# planned for the host tier at 1/2 of PEAK and run there: plans from capped traces must run
# as fast as the plan from the uncapped one (Note [Profiling under a cap]).
capped_rows() {
    local peak=$1 ratio cap
    mkdir -p $PLANS
    read -r -a T <<< "${TIER_ARGS[host]}"
    for ratio in ${PROFILE_CAPS:-1 2 4}; do
        TRACE=$OUT/trace_cap$ratio.msgpack
        cap=(); (( ratio > 1 )) && cap=(--profile-cap $((peak / ratio)) --profile-host-mem ${HOST_ONLY_MEM:-96GiB})
        echo; echo "=== profile the ideal loop under 1/$ratio of $peak bytes (at $((SECONDS - START)) s)"
        if (( ratio == 1 )) && [[ -n ${REF_TRACE:-} ]]; then
            TRACE=$REF_TRACE; echo "uncapped: $REF_TRACE"  # profiled in an earlier call
        else
            timeout 400 python3 bench/run_baseline.py --system ideal "${MODEL[@]}" --profile-trace $TRACE "${cap[@]}" \
                || { echo "profile at 1/$ratio failed"; continue; }
        fi
        REF_TRACE=${REF_TRACE:-$TRACE}
        python3 -c "import sys; from teraio.formats.trace import load_trace as l; a, b = l(sys.argv[1]), l(sys.argv[2]); \
print('trace at 1/$ratio vs', sys.argv[1], 'columns unlike:', b.columns_unlike(a), 'header:', b.header.profiled_under_cap)" \
            "$REF_TRACE" "$TRACE" | tee -a "$OUT/trace_compare.txt"
        teraio_row host $((peak / 2)) "cap 1/2 of ideal peak, trace profiled at 1/$ratio" "$PLANS/plan_from_${ratio}.json"
    done
}
# One teraio_host run at 1/2 under cProfile (not a table row): where the host time goes.
profile_host_run() {
    (( $(left) < 120 )) && { echo "no time left for the cProfile run"; return; }
    echo; echo "=== teraio_host at 1/2 under cProfile"
    timeout $(( $(left) - 15 )) python3 bench/run_baseline.py --system teraio_host "${MODEL[@]}" --gpu-mem $(($1 / 2)) \
        --plan "$PLANS/plan_host_2x.json" --cprofile /tmp/host_2x.prof --out "$OUT/profiled.jsonl" || return
    python3 -c "import pstats, sys; s = pstats.Stats('/tmp/host_2x.prof', stream=sys.stdout); \
        s.sort_stats('tottime').print_stats(40); s.sort_stats('cumtime').print_stats(40)" > "$OUT/cprofile_host_2x.txt"
}
gpu_tests() {  # tests/test_gpu.py (pytest is on the machine), about a minute
    echo; echo "=== tests/test_gpu.py"
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -25
}

if [[ $MODE == teraio ]]; then
    [[ -z ${IDEAL_PEAK:-} ]] && { echo "teraio mode needs IDEAL_PEAK (bytes, from the ideal run)"; exit 1; }
    [[ -n ${GPU_TESTS:-} ]] && gpu_tests
    teraio_rows "$IDEAL_PEAK" ${TIERS:-host mixed ssd} || exit 1
    [[ -n ${PROFILE_RUN:-} ]] && profile_host_run "$IDEAL_PEAK"
    echo "done at $((SECONDS - START)) s"
    exit 0
fi

if [[ $MODE == capped ]]; then
    [[ -z ${IDEAL_PEAK:-} ]] && { echo "capped mode needs IDEAL_PEAK (bytes, from the ideal run)"; exit 1; }
    capped_rows "$IDEAL_PEAK"
    echo "done at $((SECONDS - START)) s"
    exit 0
fi

# The ~8B model of modes big and bigbase: the example's code in the Llama-3-8B shape (8.84B params,
# fp32 weights and AdamW, TF32) at batch BIG_BATCH x 2048, capped at BIG_CAP (the device's own
# capacity less a margin). BIG_DETERMINISTIC=1: deterministic kernels, so losses compare bit for bit.
if [[ $MODE == big || $MODE == bigbase ]]; then
    MODEL=(--layers 32 --dim 4096 --heads 32 --ffn 14336 --vocab 128256 --seq 2048 --batch ${BIG_BATCH:-4}
           --dtype ${BIG_DTYPE:-fp32} --warmup ${BIG_WARMUP:-1} --steps ${BIG_STEPS:-5}
           ${BIG_DETERMINISTIC:+--deterministic})
    CAP=${BIG_CAP:-$((132 * 2**30))}
fi

if [[ $MODE == bigbase ]]; then
    # ZeRO-Offload with checkpointing and ZeRO-Infinity on the 8B, where they fail: say why.
    for f in .whl/libaio/*.deb; do dpkg -x "$f" /tmp/libaio; done
    export CPATH=/tmp/libaio/usr/include LIBRARY_PATH=/tmp/libaio/usr/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    build_ops AsyncIOBuilder CPUAdamBuilder
    free -g; df -h /tmp
    run zero_offload ${BIG_ZERO_S:-240} --act-ckpt --gpu-mem $CAP --label "8B at batch ${BIG_BATCH:-4}"
    run zero_infinity ${BIG_INFINITY_S:-240} --act-ckpt --gpu-mem $CAP --label "8B at batch ${BIG_BATCH:-4}" \
        --nvme-dir /tmp/ds_nvme
    rm -rf /tmp/ds_nvme
    echo "done at $((SECONDS - START)) s"
    exit 0
fi

if [[ $MODE == big ]]; then
    # A model bigger than the H200: plain (expected out of memory), then profiled under BIG_CAP
    # with a BIG_POOL host pool, planned with the pool and the disk (mixed) and with a larger
    # pool alone (host), both run: losses compared between the two plans.
    [[ ${BIG_PLAIN:-1} == 1 ]] && run ideal 90 --label "does it fit uncapped?"
    TRACE=$OUT/trace_8b.msgpack
    echo; echo "=== profile under $CAP bytes (at $((SECONDS - START)) s)"
    timeout 300 python3 bench/run_baseline.py --system ideal "${MODEL[@]}" --profile-trace $TRACE \
        --profile-cap $CAP --profile-host-mem ${BIG_POOL:-100GiB} || { echo "profile failed"; exit 1; }
    python3 -m teraio inspect $TRACE --json > "$OUT/trace_stats_8b.json"
    mkdir -p $PLANS
    export TERAIO_RUN_S=240
    T=(--ssds 0 --host-mem ${BIG_POOL:-100GiB})
    teraio_row host $CAP "8B at batch ${BIG_BATCH:-4}, profiled under the cap" "$PLANS/plan_8b_host.json"
    # The mixed plan's pool: what must leave the device less BIG_DISK_GIB, so that much goes to disk.
    mixed_pool=$(python3 -c "import json; s = json.load(open('$OUT/trace_stats_8b.json')); \
print(max(1, (s['peak_bytes'] - $CAP) // 2**30 - ${BIG_DISK_GIB:-4}))")GiB
    T=(--ssds 1 --host-mem ${BIG_MIXED_POOL:-$mixed_pool})
    MODEL+=(--steps ${BIG_MIXED_STEPS:-${BIG_STEPS:-5}})  # the disk is slow: fewer steps fit the call
    teraio_row mixed $CAP "8B at batch ${BIG_BATCH:-4}, profiled under the cap" "$PLANS/plan_8b_mixed.json"
    echo "done at $((SECONDS - START)) s"
    exit 0
fi

if [[ $MODE == recompute ]]; then
    # Issue 15 side by side in one call: the ideal, then at 1/RATIO of its peak (CAPS, default 2)
    # teraio_host planned with recomputation (the default) and without (--no-recompute) from one
    # trace, and PyTorch's checkpointing of every layer at the same cap.
    run ideal 150
    PEAK=${IDEAL_PEAK:-$(ideal_peak)}
    [[ -z $PEAK ]] && { echo "no ideal run succeeded: no cap to derive"; exit 1; }
    TRACE=/tmp/teraio-3b.msgpack; mkdir -p $PLANS
    echo; echo "=== profile the ideal loop"
    timeout 300 python3 bench/run_baseline.py --system ideal "${MODEL[@]}" --profile-trace $TRACE || exit 1
    python3 -m teraio inspect $TRACE --json > "$OUT/trace_stats.json"
    for ratio in ${CAPS:-2}; do
        read -r -a T <<< "${TIER_ARGS[host]}"
        teraio_row host $((PEAK / ratio)) "cap 1/$ratio of ideal peak, recompute" "$PLANS/plan_recompute_${ratio}x.json"
        T+=(--no-recompute)
        teraio_row host $((PEAK / ratio)) "cap 1/$ratio of ideal peak, moves only" "$PLANS/plan_moves_${ratio}x.json"
        run checkpointing 120 --act-ckpt --gpu-mem $((PEAK / ratio)) --label "cap 1/$ratio of ideal peak"
    done
    cp $TRACE "$OUT/"
    echo "done at $((SECONDS - START)) s"
    exit 0
fi
if [[ $MODE == pair ]]; then
    # A second configuration (say bf16 autocast: MODEL_ARGS="--preset 3b --dtype bf16 ..."):
    # its ideal, then ZeRO-Offload with checkpointing and teraio_host at 1/2 of its peak.
    [[ -n ${GPU_TESTS:-} ]] && gpu_tests
    run ideal 150
    PEAK=$(ideal_peak)
    [[ -z $PEAK ]] && { echo "no ideal run succeeded: no cap to derive"; exit 1; }
    CAPS=2 teraio_rows "$PEAK" host || exit 1
    build_ops CPUAdamBuilder
    run zero_offload 180 --act-ckpt --gpu-mem $((PEAK / 2)) --label "cap 1/2 of ideal peak"
    echo "done at $((SECONDS - START)) s"
    exit 0
fi

if [[ $MODE == infinity ]]; then
    # async_io needs libaio: the Debian packages travel unpacked-on-arrival in .whl/libaio.
    for f in .whl/libaio/*.deb; do dpkg -x "$f" /tmp/libaio; done
    export CPATH=/tmp/libaio/usr/include LIBRARY_PATH=/tmp/libaio/usr/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CFLAGS="-I$CPATH" LDFLAGS="-L$LIBRARY_PATH"
    PEAK=${IDEAL_PEAK:-}
    [[ -z $PEAK ]] && { run ideal 150; PEAK=$(ideal_peak); }
    [[ -z $PEAK ]] && { echo "no ideal peak: cannot derive the cap"; exit 1; }
    build_ops AsyncIOBuilder CPUAdamBuilder
    # One disk at ~1.5 GB/s moves ~46 GB of states each way per step: few steps, or no result.
    # ACT_CKPT=1: with per-layer checkpointing (without it the activations alone overflow the
    # 1/2 cap: out of memory in the first step, 2026-11-29).
    MODEL+=(--warmup 1 --steps ${INFINITY_STEPS:-2})
    run zero_infinity 480 ${ACT_CKPT:+--act-ckpt} --gpu-mem $((PEAK / 2)) --label "cap 1/2 of ideal peak" \
        --nvme-dir /tmp/ds_nvme
    rm -rf /tmp/ds_nvme
    exit 0
fi

run ideal 150
PEAK=$(ideal_peak)
if [[ -z $PEAK && -z ${IDEAL_PEAK:-} ]]; then  # batch 4 did not fit uncapped: everything at batch 2
    MODEL+=(--batch 2)
    run ideal 120
    PEAK=$(ideal_peak)
fi
PEAK=${PEAK:-${IDEAL_PEAK:-}}
[[ -z $PEAK ]] && { echo "no ideal run succeeded: no caps to derive"; exit 1; }
CAP2=$((PEAK / 2)) CAP4=$((PEAK / 4))
echo "ideal peak $PEAK bytes: caps $CAP2 (2x) and $CAP4 (4x)"
build_ops CPUAdamBuilder
for cap in "$CAP2 2" "$CAP4 4"; do
    set -- $cap
    label="cap 1/$2 of ideal peak"
    run zero_offload 150 --gpu-mem "$1" --label "$label"
    run checkpointing 120 --gpu-mem "$1" --label "$label"
    run save_on_cpu 150 --gpu-mem "$1" --label "$label"
done
# Extras, as time allows: ZeRO-Offload as people run it (with activation checkpointing), and
# plain PyTorch under the cap (expected to run out of memory).
run zero_offload 150 --act-ckpt --gpu-mem "$CAP2" --label "cap 1/2 of ideal peak"
run zero_offload 150 --act-ckpt --gpu-mem "$CAP4" --label "cap 1/4 of ideal peak"
run plain_capped 90 --gpu-mem "$CAP2" --label "cap 1/2 of ideal peak"
echo "done at $((SECONDS - START)) s"
