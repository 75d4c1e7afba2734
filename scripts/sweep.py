r"""Sweep a target over a grid of shapes and dtypes: audit every point, record it
to <out>/results.jsonl and .csv as it finishes, then plot and write a report.

Targets (--target):
  example           the built-in transformer block; grid names are its sizes:
                    batch, seq, d_model, heads, d_ff, layers, vocab, dtype,
                    and backward (true: training step, false: forward loss).
  MODULE:FUNCTION   a function (dotted module or path.py); --args is a template
                    of its positional arguments with {grid names} substituted:
                    --args 'x=f32[{b},{d}];w={dtype}[{d},{4*d}]'. Grid names the
                    template does not use are passed as keyword arguments.
  matmul | layer_norm | rms_norm | softmax
                    a Pallas kernel: grid names are its shape parameters
                    (matmul: m, k, n, dtype, activation, bias, residual, ...;
                    norms and softmax: rows, cols, dtype, ...). The audit is of
                    XLA's implementation; --validate and --time add the
                    kernel's check against the float32 reference and its
                    timing against XLA.

Grid (--grid): 'name=v1,v2;name2=v3,v4' is the cartesian product. A grid file
(--grid_file, .json or .toml) holds a [grid] table of lists and/or [[points]]
(extra points); --grid replaces the file's lists of the same names.

Resume: rerunning the same command skips points already recorded (a failed
point too, unless --retry_failed), so a killed sweep loses at most the points
in flight. --num_shards/--shard_index split the grid round-robin across the
machines of a job array (each writes results-<i>-of-<n>.*; run once more with
--report_only when all are done). --jobs=N runs points in N worker processes
(a crash or --point_timeout fails only that point); --jobs=0 in this process.

Exit codes: 0 every point run now was ok, 1 some point failed, 2 bad flags or
input (one line on stderr).

Example (20 points of the training step at small sizes, two processes):
  python scripts/sweep.py --target=example --out=out/sweep --jobs=2 \
      --grid='batch=1,2;seq=8,16,32,64,128;dtype=float32,bfloat16' \
      --grid='d_model=32;heads=2;d_ff=64;vocab=64'

The same points as XLA compiles them for an H200, on any machine
(pip install 'hlo-audit[gpu-target]'):
  python scripts/sweep.py --target=example --gpu_target=h200 --out=out/sweep_h200 \
      --grid='batch=1,2;seq=32,64' --grid='d_model=32;heads=2;d_ff=64;vocab=64'
"""

from __future__ import annotations

import os
import pathlib
import shlex
import sys
from typing import NoReturn

from absl import app
from absl import flags
from absl import logging

# Runnable from a checkout without installing the package.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hlo_audit._src.errors import HloAuditError  # noqa: E402
from hlo_audit._src.sweep.runner import RichReporter, SweepOptions, run_sweep  # noqa: E402
from hlo_audit._src.sweep.targets import Measure  # noqa: E402

_TARGET = flags.DEFINE_string(
    "target", None, "'example', MODULE:FUNCTION, or a kernel name (matmul, "
    "layer_norm, rms_norm, softmax).")
_OUT = flags.DEFINE_string("out", None, "Output folder: results, plots, report.")
_GRID = flags.DEFINE_multi_string(
    "grid", [], "'name=v1,v2;name2=v3': the cartesian product (repeatable: the "
    "parts join with ';')")
_GRID_FILE = flags.DEFINE_string("grid_file", None, "A .json or .toml grid file.")
_ARGS = flags.DEFINE_string(
    "args", None, "MODULE:FUNCTION only: argument template, e.g. "
    "'x=f32[{b},{d}];w=f32[{d},{f}]'.")
_JOBS = flags.DEFINE_integer(
    "jobs", 1, "Worker processes (0: run points in this process).")
_NUM_SHARDS = flags.DEFINE_integer("num_shards", 1, "Machines splitting the grid.")
_SHARD_INDEX = flags.DEFINE_integer("shard_index", 0, "This machine's shard, 0-based.")
_VALIDATE = flags.DEFINE_boolean(
    "validate", False, "Kernel targets: validate the kernel at each point.")
_TIME = flags.DEFINE_boolean(
    "time", False, "Kernel targets: time the kernel against XLA at each point.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "--time: timed calls per implementation.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "--time: untimed calls first.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of kernel inputs.")
_RETRY_FAILED = flags.DEFINE_boolean(
    "retry_failed", False, "Run points again that an earlier run recorded as failed.")
_POINT_TIMEOUT = flags.DEFINE_float(
    "point_timeout", None, "Seconds before a point is abandoned (--jobs >= 1).")
_POINT_REPORTS = flags.DEFINE_boolean(
    "point_reports", False, "Also write each point's HTML audit to <out>/points/.")
_REPORT_ONLY = flags.DEFINE_boolean(
    "report_only", False, "Only rebuild plots and report from the recorded results.")
_PLOT_X = flags.DEFINE_string(
    "plot_x", None, "Grid name for the plots' x axis (default: the numeric one "
    "with the most values).")
_PROGRESS = flags.DEFINE_boolean(
    "progress", True, "Show a progress bar and a line per point on stderr.")
_GPU_TARGET = flags.DEFINE_string(
    "gpu_target", None, "Compile each point for this GPU (h200, h100, b200, ... or a "
    "GpuTargetConfigProto file; `hlo-audit targets` lists them) on this machine; "
    "needs pip install 'hlo-audit[gpu-target]'. (--target names what is swept.)")
_GPUS = flags.DEFINE_integer("gpus", None, "With --gpu_target: a topology of N GPUs.")

flags.mark_flag_as_required("target")
flags.mark_flag_as_required("out")


def options_from_flags(argv: list[str]) -> SweepOptions:
  """The sweep's options from the parsed flags.

  Raises:
    app.UsageError: for a flag value that is out of range.
  """
  if _JOBS.value < 0:
    raise app.UsageError(f"--jobs must be >= 0, got {_JOBS.value}", exitcode=2)
  if _POINT_TIMEOUT.value is not None and _POINT_TIMEOUT.value <= 0:
    raise app.UsageError(f"--point_timeout must be > 0, got {_POINT_TIMEOUT.value}",
                         exitcode=2)
  if _POINT_TIMEOUT.value is not None and _JOBS.value == 0:
    raise app.UsageError("--point_timeout needs worker processes (--jobs >= 1)",
                         exitcode=2)
  if _GPUS.value is not None and _GPU_TARGET.value is None:
    raise app.UsageError("--gpus needs --gpu_target (e.g. --gpu_target=h200)", exitcode=2)
  if _GPU_TARGET.value is not None:
    # Before JAX starts: the CUDA plugin starts without a GPU only on the CPU
    # platform (workers inherit it).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  return SweepOptions(
      target=_TARGET.value, out=_OUT.value,
      grid=";".join(_GRID.value) or None, grid_file=_GRID_FILE.value,
      args=_ARGS.value,
      measure=Measure(validate=_VALIDATE.value, time=_TIME.value,
                      repeats=_REPEATS.value, warmup=_WARMUP.value, seed=_SEED.value,
                      device=_GPU_TARGET.value, gpus=_GPUS.value),
      jobs=_JOBS.value, num_shards=_NUM_SHARDS.value, shard_index=_SHARD_INDEX.value,
      retry_failed=_RETRY_FAILED.value, point_timeout=_POINT_TIMEOUT.value,
      point_reports=_POINT_REPORTS.value, report_only=_REPORT_ONLY.value,
      plot_x=_PLOT_X.value,
      command=shlex.join(["python", "scripts/sweep.py", *sys.argv[1:]]))


def _usage_error(message: str) -> NoReturn:
  # One line and exit code 2, not absl's default of the whole docstring.
  print(f"sweep.py: error: {message}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad or missing flag reported as a usage error."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _usage_error(str(e).splitlines()[0])


def main(argv: list[str]) -> int:
  try:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}", exitcode=2)
    options = options_from_flags(argv)
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # JAX's INFO lines are noise here.
    reporter = RichReporter() if _PROGRESS.value else None
    try:
      result = run_sweep(options, reporter)
    except KeyboardInterrupt:
      print(f"sweep.py: interrupted; rerun the same command to resume ({options.out})",
            file=sys.stderr)
      return 130
    except HloAuditError as e:
      # A bad grid, template, target or out folder.
      raise app.UsageError(str(e).splitlines()[0], exitcode=2) from None
  except app.UsageError as e:
    _usage_error(str(e))
  print(f"{result.ran} points run ({result.failed} failed), {result.skipped} already "
        f"done, {result.duplicates} duplicates merged, in {result.seconds:.1f} s; "
        f"results in {result.out}")
  for path in result.files:
    print(f"  wrote {path}")
  return 1 if result.failed else 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
