"""`hlo-audit sweep`: audit a target at every point of a grid of shapes and
dtypes, record each point as it finishes, then plot and write a report.

What is swept (SUBJECT):
  example           the built-in transformer block; grid names are its sizes:
                    batch, seq, d_model, heads, d_ff, layers, vocab, dtype,
                    and backward (true: training step, false: forward loss).
  MODULE:FUNCTION   a function (dotted module or path.py); --args is a template
                    of its positional arguments with {grid names} substituted:
                    --args 'x=f32[{b},{d}];w={dtype}[{d},{4*d}]'. Grid names the
                    template does not use are passed as keyword arguments.
  an op's name      an op of the installed kernel library (pallas_kernels:
                    matmul, layer_norm, rms_norm, softmax): grid names are its
                    shape parameters. The audit is of XLA's implementation;
                    --validate and --time add the kernel's check against its
                    float32 reference and its timing against XLA.

Grid (--grid, repeatable): 'name=v1,v2;name2=v3,v4' is the cartesian product.
A grid file (--grid-file, .json or .toml) holds a [grid] table of lists (one
value is a one-item list, seq = [16]) and/or [[points]]; --grid replaces the
file's lists of the same names. More points to run than --max-points (default
10000; counted from the lists' lengths before any point is made, so points
already done count too) stop the sweep before it starts, unless --yes is given.

Resume: rerunning the same command skips points already recorded (a failed
point too, unless --retry-failed). --num-shards/--shard-index split the grid
round-robin across machines (run once more with --report-only when all are
done). --jobs N runs points in N worker processes (a crash or --point-timeout
fails only that point); --jobs 0 in this process. --executor ray runs each
point as a task on a Ray cluster (RAY_ADDRESS, or ray://HOST:PORT); this
process still writes every result, so resuming works the same.

Flags, the grid, the --args template at every point, --target and the
results already in --out are checked before any point runs.

Exit codes: 0 every point run now was ok, 1 some point failed, 2 bad flags or
input (one line on stderr).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys

from hlo_audit._src.cli.common import ExitCode, UsageError
from hlo_audit._src.report.safe import printable

EPILOG = """examples:
  hlo-audit sweep example --out out/sweep --jobs 2 \\
      --grid 'batch=1,2;seq=8,16,32,64,128;dtype=float32,bfloat16' \\
      --grid 'd_model=32;heads=2;d_ff=64;vocab=64'
  hlo-audit sweep example --target h200 --out out/sweep_h200 \\
      --grid 'batch=1,2;seq=32,64' --grid 'd_model=32;heads=2;d_ff=64;vocab=64'
  hlo-audit sweep matmul --out out/mm --validate --grid 'm=64,128;k=256;n=512'
  RAY_ADDRESS=head-node:6379 hlo-audit sweep matmul --executor ray --out out/mm \\
      --validate --time --grid 'm=1024,2048,4096;k=4096;n=4096;dtype=bfloat16'"""


def add_parser(sub) -> None:
  p = sub.add_parser(
      "sweep", help="audit a target over a grid of shapes and dtypes, with plots "
                    "and a report",
      description=__doc__.split("\n\n", 1)[1],
      epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("subject", metavar="SUBJECT",
                 help="'example', MODULE:FUNCTION, or a kernel library's op (e.g. matmul)")
  p.add_argument("--out", required=True, help="output folder: results, plots, report")
  p.add_argument("--grid", action="append", default=[],
                 help="'name=v1,v2;name2=v3' (repeatable: the parts join with ';')")
  p.add_argument("--grid-file", help="a .json or .toml grid file")
  p.add_argument("--args", help="MODULE:FUNCTION only: argument template, e.g. "
                                 "'x=f32[{b},{d}];w=f32[{d},{f}]'")
  p.add_argument("--jobs", type=int, default=None,
                 help="worker processes (default 1; 0: run points in this process); "
                      "with --executor ray, at most N points in flight (default: "
                      "the cluster's slots)")
  p.add_argument("--executor", default="local", metavar="local|ray|ray://HOST:PORT",
                 help="where points run: local worker processes (default), or a Ray "
                      "cluster as ray.init() finds it (RAY_ADDRESS, one started on "
                      "this machine, else a new one here) or at ray://HOST:PORT; "
                      "needs pip install 'hlo-audit[ray]'")
  p.add_argument("--num-shards", type=int, default=1, help="machines splitting the grid")
  p.add_argument("--shard-index", type=int, default=0, help="this machine's shard, 0-based")
  p.add_argument("--validate", action="store_true",
                 help="kernel ops: validate the kernel at each point")
  p.add_argument("--time", action="store_true",
                 help="kernel ops: time the kernel against XLA at each point")
  p.add_argument("--repeats", type=int, default=10, help="--time: timed calls per implementation")
  p.add_argument("--warmup", type=int, default=2, help="--time: untimed calls first")
  p.add_argument("--seed", type=int, default=0, help="seed of kernel inputs")
  p.add_argument("--retry-failed", action="store_true",
                 help="run points again that an earlier run recorded as failed")
  p.add_argument("--point-timeout", type=float, default=None,
                 help="seconds before a point is abandoned (not with --jobs 0)")
  p.add_argument("--point-reports", action="store_true",
                 help="also write each point's HTML audit to OUT/points/")
  p.add_argument("--report-only", action="store_true",
                 help="only rebuild plots and report from the recorded results")
  p.add_argument("--plot-x", help="grid name for the plots' x axis (default: the numeric "
                                  "one with the most values)")
  p.add_argument("--no-progress", action="store_true",
                 help="no progress bar or per-point lines on stderr")
  p.add_argument("--target", metavar="NAME",
                 help="compile each point for this GPU (h200, h100, b200, ... or a "
                      "GpuTargetConfigProto file; needs pip install "
                      "'hlo-audit[gpu-target]') or TPU (v5e, v6e, v5p:2x2x1, ...; needs "
                      "pip install 'hlo-audit[tpu-target]'); `hlo-audit targets` lists them")
  p.add_argument("--gpus", type=int, default=None, metavar="N",
                 help="with --target: a topology of N GPUs")
  p.add_argument("--max-points", type=int, default=None, metavar="N",
                 help="stop before running more than N points (default: 10000)")
  p.add_argument("--yes", action="store_true",
                 help="run however many points the grid has (no --max-points limit)")
  p.set_defaults(handler=run)


def options_from(args: argparse.Namespace, argv: list[str] | None = None):
  """The sweep's options from the parsed flags.

  Raises:
    UsageError: for a flag value that is out of range (before anything
      runs).
  """
  from hlo_audit._src.sweep.runner import MAX_POINTS, SweepOptions
  from hlo_audit._src.sweep.targets import Measure

  from hlo_audit._src.sweep import ray_pool

  try:
    executor = ray_pool.parse_executor(args.executor)
  except ray_pool.ExecutorError as e:
    raise UsageError(f"--executor: {e}") from None
  if executor.kind == "ray":
    if args.jobs is not None and args.jobs < 1:
      raise UsageError(f"--jobs must be >= 1 with --executor ray (points run in "
                       f"the cluster), got {args.jobs}")
    jobs = args.jobs
  else:
    jobs = 1 if args.jobs is None else args.jobs
    if jobs < 0:
      raise UsageError(f"--jobs must be >= 0, got {jobs}")
  if args.num_shards < 1:
    raise UsageError(f"--num-shards must be >= 1, got {args.num_shards}")
  if not 0 <= args.shard_index < args.num_shards:
    raise UsageError(f"--shard-index must be from 0 to {args.num_shards - 1} "
                     f"(--num-shards {args.num_shards}), got {args.shard_index}")
  if args.repeats < 1:
    raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
  if args.warmup < 0:
    raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
  if args.point_timeout is not None and not (math.isfinite(args.point_timeout) and
                                             args.point_timeout > 0):
    raise UsageError(f"--point-timeout must be a number of seconds > 0, got "
                     f"{args.point_timeout}")
  if args.point_timeout is not None and jobs == 0:
    raise UsageError("--point-timeout needs worker processes (--jobs >= 1)")
  if args.gpus is not None and args.target is None:
    raise UsageError("--gpus needs --target (e.g. --target h200)")
  if args.gpus is not None and args.gpus < 1:
    raise UsageError(f"--gpus must be >= 1, got {args.gpus}")
  if args.max_points is not None and args.max_points < 1:
    raise UsageError(f"--max-points must be >= 1, got {args.max_points}")
  max_points = None if args.yes else (
      MAX_POINTS if args.max_points is None else args.max_points)
  argv = sys.argv[1:] if argv is None else argv
  return SweepOptions(
      target=args.subject, out=args.out,
      grid=";".join(args.grid) or None, grid_file=args.grid_file, args=args.args,
      measure=Measure(validate=args.validate, time=args.time, repeats=args.repeats,
                      warmup=args.warmup, seed=args.seed, device=args.target,
                      gpus=args.gpus),
      jobs=jobs, executor=args.executor, num_shards=args.num_shards,
      shard_index=args.shard_index,
      retry_failed=args.retry_failed, point_timeout=args.point_timeout,
      point_reports=args.point_reports, report_only=args.report_only,
      plot_x=args.plot_x, command=shlex.join(["hlo-audit", *argv]),
      max_points=max_points)


def run(args: argparse.Namespace, out=None) -> ExitCode:
  """Runs the sweep; one line per file written (`out`: default stdout).

  Raises:
    UsageError, HloAuditError: for bad flags or input, before any point runs.
  """
  from absl import logging

  from hlo_audit._src.sweep.runner import RichReporter, run_sweep

  out = out or sys.stdout
  options = options_from(args)
  if args.target is not None:
    # Before JAX starts: the CUDA plugin starts without a GPU only on the CPU
    # platform (workers inherit it).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  logging.set_verbosity(logging.WARNING)  # JAX's INFO lines are noise here.
  reporter = None if args.no_progress else RichReporter()
  try:
    result = run_sweep(options, reporter)
  except KeyboardInterrupt:
    print(f"hlo-audit: sweep interrupted; rerun the same command to resume "
          f"({printable(options.out)})", file=sys.stderr)
    return ExitCode.USAGE
  from hlo_audit._src.sweep import plots

  # Said after the run, so that a usage error before it stays one line.
  no_plots = plots.unavailable_reason()
  if no_plots:
    print(f"hlo-audit sweep: no plots: {no_plots}; results and reports are written",
          file=sys.stderr)
  out.write(f"{result.ran} points run ({result.failed} failed), {result.skipped} already "
            f"done, {result.duplicates} duplicates merged, in {result.seconds:.1f} s; "
            f"results in {printable(result.out)}\n")
  for path in result.files:
    out.write(f"  wrote {printable(path)}\n")
  return ExitCode.FINDINGS if result.failed else ExitCode.OK
