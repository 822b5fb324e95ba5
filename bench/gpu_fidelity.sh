#!/usr/bin/env bash
# Issue 16 on the H200, one device call (carry [".whl"]): predicted against measured iteration
# time before and after `teraio plan --calibrate` (bench/fidelity.py), host-only plans at half
# the traced peak, for the 1B example in bf16 (GPU-bound kernels) and with small batches
# (thousands of short kernels). Results: $OUT/fidelity.jsonl; the small-batch trace, plans and
# first report in $OUT/kept/. CONFIGS picks some ("bf16 small"); ACCUM_CLEAN=1 adds the 1B in bf16 with
# gradient accumulation 2, whose plan has clean entries (Note [Clean entries]).
export OUT; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TERAIO_COMMIT=${TERAIO_COMMIT:-unknown}
fidelity() { timeout 280 python3 bench/fidelity.py --device cuda --share 0.5 --out $OUT/fidelity.jsonl "$@" 2>&1 | tail -12; }
for config in ${CONFIGS:-bf16 small}; do
  case $config in
    bf16) fidelity --label 1b-bf16 -- --preset 1b --autocast bf16 --deterministic ;;
    small) fidelity --label small-batch --keep $OUT/kept -- --preset 1b --batch 4 --seq 64 ;;
  esac
done
if [[ -n ${ACCUM_CLEAN:-} ]]; then
  fidelity --label 1b-bf16-accum2 -- --preset 1b --autocast bf16 --deterministic --accum 2 --batch 4
fi
