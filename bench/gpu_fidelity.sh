#!/usr/bin/env bash
# Issue 16 on the H200, one device call (carry [".whl"]): predicted against measured iteration
# time before and after `teraio plan --calibrate` (bench/fidelity.py), for the 1B example in
# bf16 (GPU-bound kernels) and with small batches (thousands of short kernels), host-only
# plans at half the traced peak. Results: $OUT/fidelity.jsonl.
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
timeout 280 python3 bench/fidelity.py --device cuda --share 0.5 --label 1b-bf16 --out $OUT/fidelity.jsonl \
    -- --preset 1b --autocast bf16 --deterministic 2>&1 | tail -12
timeout 250 python3 bench/fidelity.py --device cuda --share 0.5 --label small-batch --out $OUT/fidelity.jsonl \
    -- --preset 1b --batch 4 --seq 64 2>&1 | tail -12
