#!/usr/bin/env bash
# One GPU session on the lent H200: environment facts, GPU tests, then the benchmarks (the op library
# and the decorator's call overhead).
# Usage (on the GPU machine, repository root): bash benchmarks/gpu_session.sh [pytest args...]
# Environment: SKIP_TESTS=1, SKIP_BENCH=1, SKIP_OVERHEAD=1, BENCH_ARGS="--only none --train rmsnorm",
# TEST_TIMEOUT / BENCH_TIMEOUT (seconds). Optional wheels (Liger-Kernel as a peer, optuna) are
# installed from .whl/ when present (see ../shared/gpu/fetch-wheels.sh). Writes logs and JSON under
# $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/env.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a "$OUT/env.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -m gpu tests -q -p no:cacheprovider "$@" 2>&1 \
    | tee "$OUT/gpu-tests.log" | tail -40
fi
if [ "${SKIP_OVERHEAD:-0}" != 1 ]; then
  timeout 120 python3 benchmarks/dispatch_overhead.py --out "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" | tail -6
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-540}" python3 benchmarks/ops.py --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench.log" | grep -v '^{' | tail -30
fi
