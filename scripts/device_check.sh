#!/usr/bin/env bash
# The GPU device check: one call of under 8 minutes on the lent H200.
#
#   run(command="bash scripts/device_check.sh", timeout_s=540)
#   bash scripts/device_check.sh --dry-run      # here, on CPU: tiny shapes,
#                                               # interpreted kernels, no install
#
# On the GPU (jax 0.11.2 there, no package registry: --no-deps), in order:
#   1. validate every kernel compiled, kernels required: a fallback to XLA
#      fails its case (`python -m pallas_kernels validate --require-kernel=true`),
#      the Mosaic GPU matmul's cases ("mosaic" tag) included: on a Hopper the
#      matmul is built with Mosaic GPU wherever its guard accepts the call;
#   2. the bench table against XLA's own user-level computation for the docs' (docs/ops.md)
#      shapes ("device" tag: 8192x512x8192 bf16 bias+gelu+residual, int8
#      decode, layer norm + residual 8192x8192 bf16, causal softmax 4096x4096);
#   3. the matmul's Mosaic GPU and Triton kernels and XLA side by side, ratios
#      in one run ("backends" tag: JAX's bf16 4096^3, 8192x512x8192
#      bias+gelu+residual, the int8 decode; bench_backends.py);
#   4. the built-in examples compiled for the GPU, their optimized HLO with
#      XLA's buffer assignment saved as test fixtures (capture_fixtures.py),
#      and the audit of the example;
#   5. the time model against the GPU's own kernel times: the ground-truth
#      suite's programs profiled (jax.profiler), each kernel's estimate beside
#      its measured time, Spearman and the step ratio per program
#      (bench_time_model.py; the estimates are XLA's H200 spec's until this
#      step has run);
#   6. the GPU-marked tests.
# $OUT gets 8 files, nothing deeper than $OUT itself: summary.md (the one
# page: device, versions, verdicts, the four tables), validate.json,
# bench.json, backends.json, example_audit.json, time_model.json,
# fixtures.tar.gz, logs.tar.gz. Every step has its own timeout (together under 8 minutes) and
# the script goes on after a failure; the summary says which failed.
set -uo pipefail
MODE=gpu
if [[ "${1:-}" == "--dry-run" ]]; then MODE=dry; fi
OUT="${OUT:-out/device}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
START=$(date +%s)
status() { echo "$1: exit $2 after $(( $(date +%s) - START )) s" | tee -a "$OUT/logs/steps.log"; }

if [[ $MODE == gpu ]]; then
  VALIDATE=(--tags=ci,nonfinite,mosaic --interpret=false --require-kernel=true)
  BENCH=(--tags=device --repeats=20 --warmup=3)
  BACKENDS=(--tags=backends --repeats=20 --warmup=3)
  FIXTURES=()
  TIME_MODEL=(--runs=10)
  T_VALIDATE=165 T_BENCH=70 T_BACKENDS=55 T_FIXTURES=55 T_AUDIT=40 T_TIME=60 T_TESTS=35
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/logs/install.log" 2>&1
  status install $?
  nvidia-smi >"$OUT/logs/nvidia-smi.txt" 2>&1
else
  # CPU dry run: the same pieces at sizes a CPU runs in a few minutes.
  VALIDATE=(--tags=ci --ops=softmax,rms_norm --interpret=auto --require-kernel=false)
  BENCH=(--tags=ci --ops=softmax --repeats=2 --warmup=1)
  BACKENDS=(--tags=backends_dry --repeats=1 --warmup=1)
  FIXTURES=(--tiny)
  TIME_MODEL=(--runs=3 --models=linen_mlp,grad_accum)
  T_VALIDATE=400 T_BENCH=300 T_BACKENDS=300 T_FIXTURES=300 T_AUDIT=60 T_TIME=300 T_TESTS=120
  echo "dry run: no GPU, kernels interpreted" >"$OUT/logs/nvidia-smi.txt"
fi
"$PY" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())" \
  >"$OUT/logs/jax.txt" 2>&1

timeout "$T_VALIDATE" "$PY" -m pallas_kernels validate "${VALIDATE[@]}" --out="$OUT/validate" \
  >"$OUT/logs/validate.log" 2>&1
status validate $?

timeout "$T_BENCH" "$PY" -m pallas_kernels bench "${BENCH[@]}" --out="$OUT/bench" \
  >"$OUT/logs/bench.log" 2>&1
status bench $?

timeout "$T_BACKENDS" "$PY" scripts/bench_backends.py "${BACKENDS[@]}" --out="$OUT/backends" \
  >"$OUT/logs/backends.log" 2>&1
status backends $?

timeout "$T_FIXTURES" "$PY" scripts/capture_fixtures.py "${FIXTURES[@]}" --out="$OUT/fixtures" \
  >"$OUT/logs/fixtures.log" 2>&1
status fixtures $?
tar -czf "$OUT/fixtures.tar.gz" -C "$OUT" fixtures && rm -rf "$OUT/fixtures"

timeout "$T_AUDIT" "$PY" -m hlo_audit example --json >"$OUT/example_audit.json" \
  2>"$OUT/logs/audit.err"
status audit $?

timeout "$T_TIME" "$PY" scripts/bench_time_model.py "${TIME_MODEL[@]}" --verbose \
  --json="$OUT/time_model.json" >"$OUT/logs/time_model.log" 2>&1
status time-model $?

timeout "$T_TESTS" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests \
  >"$OUT/logs/pytest_gpu.log" 2>&1
status gpu-tests $?

{
  echo "# Device check $(date -u +%Y-%m-%dT%H:%MZ) ($MODE)"; echo
  echo '```'
  head -12 "$OUT/logs/nvidia-smi.txt"; cat "$OUT/logs/jax.txt"; cat "$OUT/logs/steps.log"
  echo '```'; echo
  echo "## Validation (kernels required: a fallback fails)"; echo
  if [[ -f "$OUT/validate.md" ]]; then cat "$OUT/validate.md"; else tail -20 "$OUT/logs/validate.log"; fi
  echo; echo "## Speed against XLA (same user-level computation)"; echo
  if [[ -f "$OUT/bench.md" ]]; then cat "$OUT/bench.md"; else tail -20 "$OUT/logs/bench.log"; fi
  echo; echo "## Matmul: Mosaic GPU, Triton and XLA (same inputs, one run)"; echo
  if [[ -f "$OUT/backends.md" ]]; then cat "$OUT/backends.md"; else tail -20 "$OUT/logs/backends.log"; fi
  echo; echo "## Time model: estimated against measured kernel times"; echo; echo '```'
  grep -v "^ " "$OUT/logs/time_model.log" | tail -20; echo '```'
  echo; echo "## Fixtures and audit"; echo; echo '```'
  tail -6 "$OUT/logs/fixtures.log"; tail -3 "$OUT/logs/audit.err"
  echo '```'; echo; echo "## GPU tests"; echo; echo '```'
  tail -4 "$OUT/logs/pytest_gpu.log"; echo '```'
} >"$OUT/summary.md"
rm -f "$OUT/validate.md" "$OUT/bench.md" "$OUT/backends.md"  # In the summary.
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
cat "$OUT/summary.md"
