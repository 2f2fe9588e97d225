#!/usr/bin/env bash
# One GPU session on the lent H200: environment facts, GPU tests, then the benchmarks (core ops and the
# decorator's call overhead).
# Usage (on the GPU machine, repository root): bash benchmarks/gpu_session.sh [pytest args...]
# Writes logs and bench.json under $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/env.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a "$OUT/env.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 420 python3 -m pytest -m gpu tests -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 benchmarks/core.py --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -12
  python3 benchmarks/dispatch_overhead.py --out "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" | tail -4
fi
