"""`python -m pallas_kernels bench`: the kernels against XLA, timed in one run.

For every case of `--tags` (default "bench": realistic sizes such as 8192x8192
bfloat16 norms) of each op in `--ops`, times the kernel and XLA (median of
`--repeats` after `--warmup`), and prints time, achieved GB/s and TFLOP/s, %
of the device roofline and the ratio speedup = xla_time / kernel_time.
`--out` writes <out>.json (all fields) and <out>.md (the table). In interpret
mode (no GPU) the report says plainly that the timings mean nothing.
"""

from __future__ import annotations

import argparse
import pathlib

from pallas_kernels._src.cli.common import (ExitCode, UsageError, comma_list, count,
                                            selected_ops)

_EXAMPLE = ("python -m pallas_kernels bench --ops=layer_norm,rms_norm,softmax --tags=bench "
            "--repeats=20 --out=out/bench")


def add_parser(sub) -> None:
  p = sub.add_parser(
      "bench", help="time the kernels against XLA in the same run",
      description=__doc__.split("\n\n", 1)[1], epilog=f"example: {_EXAMPLE}")
  p.add_argument("--ops", type=comma_list, default=None, metavar="OP,...",
                 help="ops to benchmark (default: every registered op)")
  p.add_argument("--tags", type=comma_list, default=["bench"], metavar="TAG,...",
                 help="case tags to run (default: bench)")
  p.add_argument("--out", metavar="PATH", help="write PATH.json and PATH.md")
  p.add_argument("--repeats", type=count(1), default=20, help="timed calls per implementation")
  p.add_argument("--warmup", type=count(0), default=3, help="untimed calls first (compiles)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
  p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> ExitCode:
  """Benchmarks, prints ratios against XLA and writes the results files."""
  from pallas_kernels._src import bench as bench_lib  # noqa: PLC0415 - imports JAX
  from pallas_kernels._src import registry  # noqa: PLC0415

  try:
    report = bench_lib.bench(selected_ops(args.ops), tags=args.tags, repeats=args.repeats,
                             warmup=args.warmup, seed=args.seed)
  except registry.NoCasesError as e:
    raise UsageError(str(e)) from None
  print(report)
  print()
  for row in report.rows:
    if row.speedup is None:
      print(f"{row.op:12s} {row.case:55s} no speed-up: the kernel call fell back to XLA "
            f"({row.fallback})")
      continue
    verdict = "faster" if row.speedup > 1 else "slower"
    print(f"{row.op:12s} {row.case:55s} kernel/XLA: {row.speedup:6.2f}x {verdict} "
          f"({row.kernel_ms:.3f} ms vs {row.xla_ms:.3f} ms)")
  if args.out:
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(report.to_json() + "\n")
    path.with_suffix(".md").write_text(report.to_markdown() + "\n")
  return ExitCode.OK
