#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels that the lent GPU machine lacks: it has
# python3.12 with torch, numpy, msgpack, click and rich but no network, no pydantic and no
# kvikio. Run it from the project root, on any x86-64 machine with pip and network access;
# extra requirements (e.g. `hjson` for DeepSpeed) are fetched too.
# Usage: bash bench/fetch_wheels.sh [REQUIREMENT ...]
set -euo pipefail
mkdir -p .whl
# --no-deps: pip resolves nothing for another interpreter, so every need is named here.
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "$@"
}
download kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 'rapids-logger==0.3.*' \
  'pydantic==2.*' annotated-types typing-inspection typing-extensions "$@"
# pydantic pins one exact pydantic-core: fetch that one, not the newest.
pydantic_whl=$(ls -t .whl/pydantic-2*.whl | head -1)
core=$(unzip -p "$pydantic_whl" '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core *(*==\([0-9.]*\).*/\1/p')
download "pydantic-core==$core"
ls -1 .whl
cat <<'MSG'
On the GPU machine, carry .whl and start the command with:
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;
MSG
