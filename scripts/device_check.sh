#!/usr/bin/env bash
# The GPU device check: one call of a few minutes on the lent machine.
#
#   run(command="bash scripts/device_check.sh", timeout_s=540)
#
# Installs the project (no registry there: --no-deps), then:
#   1. validates every kernel compiled on the GPU (validate_kernels.py);
#   2. benchmarks every op against XLA at realistic shapes (bench_kernels.py);
#   3. captures the optimized GPU HLO of the built-in examples as fixtures;
#   4. audits the built-in example and runs the GPU-marked tests.
# Everything lands in $OUT (at most 8 files come back, so logs and fixtures
# are archived): validate.{json,md}, bench.{json,md}, fixtures.tar.gz,
# example_audit.json, logs.tar.gz, summary.md.
set -uo pipefail
OUT="${OUT:-out/device}"
mkdir -p "$OUT" "$OUT/logs"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/logs/steps.log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/logs/install.log" 2>&1
nvidia-smi >"$OUT/logs/nvidia-smi.txt" 2>&1
python3 -c "import jax; print(jax.__version__, jax.devices())" | tee "$OUT/logs/jax.txt"

step validate
timeout 180 python3 scripts/validate_kernels.py --tags=ci,nonfinite --interpret=false \
  --out="$OUT/validate" >"$OUT/logs/validate.log" 2>&1
echo "validate exit $?" | tee -a "$OUT/logs/steps.log"

step bench
timeout 180 python3 scripts/bench_kernels.py --tags=bench --repeats=20 --warmup=3 \
  --out="$OUT/bench" >"$OUT/logs/bench.log" 2>&1
echo "bench exit $?" | tee -a "$OUT/logs/steps.log"

step fixtures
timeout 120 python3 scripts/capture_fixtures.py --out="$OUT/fixtures" >"$OUT/logs/fixtures.log" 2>&1
echo "fixtures exit $?" | tee -a "$OUT/logs/steps.log"
tar -czf "$OUT/fixtures.tar.gz" -C "$OUT" fixtures && rm -rf "$OUT/fixtures"

step audit
timeout 60 hlo-audit example --json >"$OUT/example_audit.json" 2>"$OUT/logs/audit.err"
timeout 120 python3 -m pytest -q -m gpu tests >"$OUT/logs/pytest_gpu.log" 2>&1
echo "gpu tests exit $?" | tee -a "$OUT/logs/steps.log"

{
  echo "# Device check $(date -u +%Y-%m-%d)"; echo
  echo '```'; head -20 "$OUT/logs/nvidia-smi.txt"; cat "$OUT/logs/jax.txt"; echo '```'; echo
  echo "## Validation"; echo; cat "$OUT/validate.md" 2>/dev/null || tail -30 "$OUT/logs/validate.log"; echo
  echo "## Speed against XLA"; echo; cat "$OUT/bench.md" 2>/dev/null || tail -30 "$OUT/logs/bench.log"; echo
  echo "## GPU tests"; echo; tail -5 "$OUT/logs/pytest_gpu.log"
} >"$OUT/summary.md"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
cat "$OUT/summary.md"
