#!/usr/bin/env bash
# Two runtimes side by side on a short-kernel job (the 1B fp32 at batch 4 x 64, host-only plan at
# 1/2 of its traced peak: bench/fidelity.py's small-batch configuration), where the job's thread
# issues ~2,000 copies per iteration, in one device call; first bench/copy_issue_cost.py on the
# new tree. Trees from git archives, as in bench/gpu_ab_3b.sh:
#   git archive <old sha> -o old.tar; git archive HEAD -o snap.tar
#   device: carry [".whl", "snap.tar", "old.tar"], command: mkdir -p /tmp/r /tmp/o && tar -xf snap.tar -C /tmp/r &&
#     tar -xf old.tar -C /tmp/o && cp -r .whl /tmp/r/ && cd /tmp/r && TERAIO_COMMIT=<new> OLD_COMMIT=<old> OLD=/tmp/o bash bench/gpu_ab_small_batch.sh
# Runs new, old, new, old (ORDER to change), 2 warm-up and 5 measured steps each, one plan for all
# (made by the new tree); result lines in $OUT/ab_small_batch.jsonl.
export OUT; NEW=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deepspeed) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$NEW
echo "date $(date -u +%FT%TZ) new ${TERAIO_COMMIT:-new} old ${OLD_COMMIT:-old}"
timeout 120 python3 bench/copy_issue_cost.py --out $OUT/copy_issue.json | grep -A12 us_per_copy
JOB=(--preset 1b --batch 4 --seq 64 --dtype fp32)
timeout 200 python3 bench/run_baseline.py --system ideal "${JOB[@]}" --warmup 2 --steps 3 \
    --profile-trace /tmp/small.msgpack > /dev/null 2>&1
PEAK=$(python3 -m teraio inspect /tmp/small.msgpack --json | python3 -c "import json,sys;print(json.load(sys.stdin)['peak_bytes'])")
python3 -m teraio plan /tmp/small.msgpack --gpu-mem $((PEAK / 2)) --ssds 0 --host-mem 32GiB --host-gbps 37 \
    --pcie-gbps 55 --headroom 1GiB -o /tmp/small.json > /dev/null
for V in ${ORDER:-new old new old}; do
  D=$([[ $V == old ]] && echo $OLD || echo $NEW)
  C=$([[ $V == old ]] && echo ${OLD_COMMIT:-old} || echo ${TERAIO_COMMIT:-new})
  (cd $D && PYTHONPATH=/tmp/site:$D TERAIO_COMMIT=$C timeout 200 python3 bench/run_baseline.py --system teraio_host \
      "${JOB[@]}" --warmup 2 --steps 5 --gpu-mem $((PEAK / 2)) --plan /tmp/small.json \
      --label "A/B $V ($C)" --out $OUT/ab_small_batch.jsonl 2>&1 | grep "\[bench\]")
  echo "^ $V ($C)"
done
