#!/usr/bin/env bash
# Two runtimes side by side on the 3B fp32 chained plan at 1/2 (host-bound: the runtime's own
# host time sets its pace), in one device call; first the 1B twin run (bench/gpu_teraio.sh at
# 50%) of the tree's runtime. The older commit's tree is extracted from $OLD_TAR (ignored, carried):
#   git archive <old sha> -o old.tar; git archive HEAD -o snap.tar
#   device: carry [".whl", "snap.tar", "old.tar"], command: mkdir -p /tmp/r /tmp/o && tar -xf snap.tar -C /tmp/r &&
#     tar -xf old.tar -C /tmp/o && cp -r .whl /tmp/r/ && cd /tmp/r && TERAIO_COMMIT=<new> OLD_COMMIT=<old> OLD=/tmp/o bash bench/gpu_ab_3b.sh
# SKIP_TWIN=1 leaves the twin run out. Runs new, old, new (ORDER to change), 2 warm-up and 4 measured steps each; result lines in $OUT/ab_3b.jsonl.
export OUT; NEW=$PWD
if [[ -z ${SKIP_TWIN:-} ]]; then
  STEPS=6 SHARES=50 bash bench/gpu_teraio.sh 2>&1 | grep -E "^date|losses|LOSSES|median_step_ms|last planned|starting its"
else
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
fi
export PYTHONPATH=/tmp/site:$NEW
python3 -m teraio plan traces/h200-3b-fp32-writes.msgpack --gpu-mem 41756124416 --ssds 0 --host-mem 56GiB \
    --host-gbps 37 --pcie-gbps 55 --headroom 1GiB -o /tmp/p3b.json > /dev/null
for V in ${ORDER:-new old new}; do
  D=$([[ $V == old ]] && echo $OLD || echo $NEW)
  C=$([[ $V == old ]] && echo ${OLD_COMMIT:-old} || echo ${TERAIO_COMMIT:-new})
  (cd $D && PYTHONPATH=/tmp/site:$D TERAIO_COMMIT=$C timeout 170 python3 bench/run_baseline.py --system teraio_host \
      --preset 3b --dtype fp32 --warmup 2 --steps 4 --gpu-mem 41756124416 --plan /tmp/p3b.json \
      --label "A/B $V ($C)" --out $OUT/ab_3b.jsonl 2>&1 | grep "\[bench\]")
  echo "^ $V ($C)"
done
