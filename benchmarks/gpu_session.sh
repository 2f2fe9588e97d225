#!/usr/bin/env bash
# One GPU session on the lent machine: environment facts, then named steps, in lanes.
#
# Usage (on the GPU machine, repository root):
#   LANE0="overhead tests attention" LANE1="after:overhead spaces strategies" bash benchmarks/gpu_session.sh
#
# Each lane runs its steps in order on its own GPU (lane N sees only GPU N through
# CUDA_VISIBLE_DEVICES; with one GPU, lane 1 runs after lane 0 on the same GPU). "after:STEP" waits
# until STEP (in another lane) has finished: host-time measurements such as the call overhead want
# the host to themselves. Without LANE0/LANE1 the default is "tests overhead ops" on one lane.
#
# Steps (each writes STEP.log and its JSON under $RESULTS, and is bounded by a timeout). At the end
# everything under $RESULTS is packed into $RESULTS/session.tar.gz (the lent machine returns few files).
#   tests       pytest -m gpu $TEST_PATHS $TEST_ARGS          (TEST_TIMEOUT, default 300 s; TEST_PATHS default tests;
#               TEST_ISOLATE=1: a process per path, so one CUDA fault fails only its file)
#   overhead    benchmarks/dispatch_overhead.py              (120 s)
#   ops         benchmarks/ops.py $OPS_ARGS                  (OPS_TIMEOUT, default 540 s)
#   ops-before  the same in $BEFORE_TREE (default before/: an export of an older commit, e.g.
#               git archive REV src benchmarks pyproject.toml | tar -x -C before), on its own package and
#               database: LANE0="ops-before ops", then benchmarks/compare_ops.py ops-before.json ops.json
#   attention   benchmarks/attention.py $ATTENTION_ARGS      (ATTENTION_TIMEOUT, default 300 s)
#   matmul      benchmarks/matmul.py $MATMUL_ARGS            (MATMUL_TIMEOUT, default 300 s)
#   decode      benchmarks/decode.py --budget $DECODE_BUDGET $DECODE_ARGS (DECODE_TIMEOUT, default 900 s):
#               every projection of Llama-3.2-1B and Llama-3-8B at M = 1 and 8 (20 rows, ~45 s a row at
#               budget 24); decode-1b and decode-8b: one model each (10 rows), to run the two on two lanes
#   decode-step benchmarks/decode_step.py --budget $DECODE_STEP_BUDGET $DECODE_STEP_ARGS (DECODE_STEP_TIMEOUT,
#               default 1500 s): whole decode steps (16 Llama-3.2-1B-shaped layers at batch 1 and 8, 8
#               Llama-3-8B-shaped layers; 1024-token cache) for eager, CUDA graphs, torch.compile and
#               kernelsmith, and Hugging Face generate() of 256 tokens after 512; decode-step-1b,
#               decode-step-8b, decode-step-hf: one part each (--only 1b-b1,1b-b8 / 8b-l8 / hf-1b)
#   lce         benchmarks/linear_cross_entropy.py --budget $LCE_BUDGET $LCE_ARGS (LCE_TIMEOUT, default 900 s):
#               fused linear + cross-entropy forward+backward, 16384 tokens, hidden 2048 and 4096, vocabulary
#               128256, against torch.compile and Liger: time and peak memory
#   train       benchmarks/train_step.py --budget $TRAIN_BUDGET $TRAIN_ARGS (TRAIN_TIMEOUT, default 540 s): one
#               training step of a Hugging Face Llama (hidden 2048, 4 layers, vocabulary 128256, bf16, with labels)
#               for eager, torch.compile, Liger and kernelsmith: time, peak memory, loss and gradient agreement;
#               train-2x2048 and train-4x4096: one batch each (the two rows together may outlast one command)
#   spaces      benchmarks/record_space.py $SPACES           (SPACES_TIMEOUT, default 400 s)
#   strategies  benchmarks/strategies.py $STRATEGY_WORKLOADS (STRATEGIES_TIMEOUT, default 300 s)
#   scale-out   benchmarks/scale_out.py $SCALE_OUT_ARGS     (SCALE_OUT_TIMEOUT, default 3000 s; two GPUs):
#               tuning throughput on 1 GPU against 2 and the Ray executor (issue 17); --only rmsnorm --budgets 50
#               for one row (~3 runs of a search each)
#   model       kernelsmith optimize $OPTIMIZE_ARGS, then verify --max-autotune, on $MODEL $MODEL_ARGS
#                                                            (MODEL_TIMEOUT, default 400 s)
#
# Optional wheels (Liger-Kernel as a peer, optuna, pydantic) are installed from .whl/ when present
# (see ../shared/gpu/fetch-wheels.sh).
set -uo pipefail
OUT=${OUT:-out}
RESULTS=${RESULTS:-/tmp/ks-session}
mkdir -p "$OUT" "$RESULTS"
REPO=$PWD
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$RESULTS/env.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" \
  | tee -a "$RESULTS/env.txt"
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)

SPACES=${SPACES:-"rmsnorm:8192x4096 softmax:8192x4096"}
STRATEGY_WORKLOADS=${STRATEGY_WORKLOADS:-"rmsnorm:8192x4096 softmax:8192x4096"}
MODEL=${MODEL:-llama-160m}
MODEL_ARGS=${MODEL_ARGS:-"--batch 8 --seq 2048 --dtype bf16"}

step() {  # step NAME: one step, its log in $RESULTS/NAME.log, then a marker $RESULTS/NAME.done
  local name=$1 started=$SECONDS
  echo "=== $name (GPU ${CUDA_VISIBLE_DEVICES:-all}) $(date -u +%H:%M:%S)"
  case $name in
    tests) # SIGINT, so that pytest still prints its summary of failures when the step runs out of time.
           # TEST_ISOLATE=1: one pytest process per path, so that a CUDA fault (an illegal address poisons
           # the process's context) fails only its own file; TEST_TIMEOUT is then the budget of them all.
           if [ -n "${TEST_ISOLATE:-}" ]; then
             deadline=$((SECONDS + ${TEST_TIMEOUT:-300}))
             for path in ${TEST_PATHS:-tests/gpu}; do
               left=$((deadline - SECONDS))
               if [ "$left" -le 10 ]; then echo "=== $path: not run (no time left)"; continue; fi
               echo "=== $path ($left s left)"
               timeout -s INT "$left" python3 -m pytest -m gpu "$path" -q -p no:cacheprovider -rfE --tb=short \
                 ${TEST_ARGS:-}
               echo "=== $path: exit $?"
             done
           else
             timeout -s INT "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu ${TEST_PATHS:-tests} -q -p no:cacheprovider \
               -rfE --tb=short ${TEST_ARGS:-}
           fi ;;
    overhead) timeout 120 python3 benchmarks/dispatch_overhead.py --out "$RESULTS/overhead.json" ;;
    ops) timeout "${OPS_TIMEOUT:-540}" python3 benchmarks/ops.py --out "$RESULTS/ops.json" ${OPS_ARGS:-} ;;
    ops-before) # the old tree's own benchmark on the old tree's package, its own database
           (cd "${BEFORE_TREE:-before}" && export PYTHONPATH="$PWD/src${PYTHONPATH#"$REPO/src"}" \
            && timeout "${OPS_TIMEOUT:-540}" python3 benchmarks/ops.py --out "$RESULTS/ops-before.json" \
                 --db /tmp/ks-ops-before.db ${OPS_ARGS:-}) ;;
    attention) timeout "${ATTENTION_TIMEOUT:-300}" python3 benchmarks/attention.py --out "$RESULTS/attention.json" \
                 --db "/tmp/ks-attention.db" ${ATTENTION_ARGS:-} ;;
    matmul) timeout "${MATMUL_TIMEOUT:-300}" python3 benchmarks/matmul.py --out "$RESULTS/matmul.json" \
              --db "/tmp/ks-matmul.db" ${MATMUL_ARGS:-} ;;
    decode|decode-1b|decode-8b)
            timeout "${DECODE_TIMEOUT:-900}" python3 benchmarks/decode.py --out "$RESULTS/$name.json" \
              --db "/tmp/ks-$name.db" --budget "${DECODE_BUDGET:-24}" \
              $([ "$name" = decode ] || echo "--models ${name#decode-}") ${DECODE_ARGS:-} ;;
    decode-step|decode-step-1b|decode-step-8b|decode-step-hf)
            only=$(case $name in decode-step-1b) echo 1b-b1,1b-b8;; decode-step-8b) echo 8b-l8;;
                                 decode-step-hf) echo hf-1b;; esac)
            timeout "${DECODE_STEP_TIMEOUT:-1500}" python3 benchmarks/decode_step.py --out "$RESULTS/$name.json" \
              --db "/tmp/ks-$name.db" --budget "${DECODE_STEP_BUDGET:-16}" ${only:+--only $only} \
              ${DECODE_STEP_ARGS:-} ;;
    lce) timeout "${LCE_TIMEOUT:-900}" python3 benchmarks/linear_cross_entropy.py --out "$RESULTS/lce.json" \
           --db "/tmp/ks-lce.db" --budget "${LCE_BUDGET:-30}" ${LCE_ARGS:-} ;;
    train|train-2x2048|train-4x4096)
           timeout "${TRAIN_TIMEOUT:-540}" python3 benchmarks/train_step.py --out "$RESULTS/$name.json" \
             --db "/tmp/ks-train.db" --budget "${TRAIN_BUDGET:-60}" \
             $([ "$name" = train ] || echo "--only ${name#train-}") ${TRAIN_ARGS:-} ;;
    spaces) timeout "${SPACES_TIMEOUT:-400}" python3 benchmarks/record_space.py $SPACES --dtype bf16 \
              --out-dir "$RESULTS/spaces" ;;
    strategies) timeout "${STRATEGIES_TIMEOUT:-300}" python3 benchmarks/strategies.py $STRATEGY_WORKLOADS \
                  --budget "${STRATEGY_BUDGET:-20}" --out "$RESULTS/strategies.json" ;;
    model) (export KERNELSMITH_DB=/tmp/ks-model.db
            timeout "${MODEL_TIMEOUT:-400}" bash -c "python3 -m kernelsmith optimize $MODEL $MODEL_ARGS \
              --budget ${MODEL_BUDGET:-60} ${OPTIMIZE_ARGS:-} --out $RESULTS/model-optimize.json && python3 -m kernelsmith verify $MODEL \
              $MODEL_ARGS --seeds 1 --max-autotune --json > $RESULTS/model-verify.json; \
              tail -c 3000 $RESULTS/model-verify.json") ;;
    scale-out) timeout "${SCALE_OUT_TIMEOUT:-3000}" python3 benchmarks/scale_out.py --out "$RESULTS/scale_out.json" \
                 ${SCALE_OUT_ARGS:-} ;;
    *) echo "unknown step $name" ;;
  esac > "$RESULTS/$name.log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - started)) s"
  tail -"${TAIL_LINES:-25}" "$RESULTS/$name.log" | grep -v '^{'
  touch "$RESULTS/$name.done"
}

lane() {  # lane GPU STEPS...
  local gpu=$1; shift
  for item in "$@"; do
    if [[ $item == after:* ]]; then
      for _ in $(seq 600); do [ -e "$RESULTS/${item#after:}.done" ] && break; sleep 2; done
    else
      CUDA_VISIBLE_DEVICES=$gpu step "$item"
    fi
  done
}

LANE0=${LANE0:-"tests overhead ops"}
LANE1=${LANE1:-}
if [ "$GPUS" -ge 2 ] && [ -n "$LANE1" ]; then
  lane 0 $LANE0 > "$RESULTS/lane0.txt" 2>&1 &
  lane 1 $LANE1 > "$RESULTS/lane1.txt" 2>&1 &
  wait
  cat "$RESULTS/lane0.txt" "$RESULTS/lane1.txt"
else
  lane 0 $LANE0 $LANE1  # one GPU: one lane after the other ("after:" steps have run by then)
fi
tar czf "$OUT/session.tar.gz" -C "$RESULTS" .
