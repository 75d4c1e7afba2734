"""`hlo-audit calibrate`: measure this machine's CPU for the time model."""

from __future__ import annotations

import argparse
import json
import sys

from hlo_audit._src.cli.common import ExitCode, add_verbose_flag


def add_parser(sub) -> None:
  p = sub.add_parser(
      "calibrate", help="measure this machine's CPU for the time model (cached)",
      description="Measure what XLA:CPU does per second on this machine (memory "
                  "bandwidth, matmul and vector rates, launch and threading overheads), "
                  "the facts the time model prices CPU kernels with. The audit measures "
                  "once per machine and jax version and caches the result; this "
                  "measures again and prints the facts with their sources.")
  p.add_argument("--show", action="store_true",
                 help="print the cached facts (measuring only when none are cached)")
  p.add_argument("--json", action="store_true", help="print the facts as JSON")
  add_verbose_flag(p)
  p.set_defaults(handler=run)


def run(args: argparse.Namespace, out=None) -> ExitCode:
  from hlo_audit._src.report.units import fmt_bytes, fmt_time
  from hlo_audit._src.target import calibration

  out = out or sys.stdout
  facts = calibration.cpu_facts(recalibrate=not args.show)
  if args.json:
    out.write(json.dumps(facts.to_dict(), indent=2) + "\n")
    return ExitCode.OK
  rows = [
      ("memory bandwidth", f"{facts.memory_bandwidth / 1e9:.1f} GB/s"),
      *((f"  working sets to {fmt_bytes(size)}", f"{rate / 1e9:.1f} GB/s")
        for size, rate in facts.cache_bandwidths),
      ("strided access", f"{facts.strided_bandwidth / 1e9:.2f} GB/s"
       if facts.strided_bandwidth else "as streaming"),
      *((f"matmul {t}", f"{r / 1e9:.0f} GFLOP/s") for t, r in facts.matrix_flops.items()),
      *((f"vector {t}", f"{r / 1e9:.0f} GFLOP/s") for t, r in facts.vector_flops.items()),
      ("transcendentals", f"{facts.transcendentals_per_second / 1e9:.2f} G/s"),
      ("loop-emitted reductions", f"{facts.loop_reduction_rate / 1e9:.2f} G elements/s"
       if facts.loop_reduction_rate else "at the vector rate"),
      ("launch overhead", fmt_time(facts.launch_overhead)),
      ("threaded kernel overhead", fmt_time(facts.parallel_overhead)),
  ]
  width = max(len(k) for k, _ in rows)
  lines = [f"{facts.description}: {'cached' if args.show else 'measured'} "
           f"({calibration.cache_path()})"]
  lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
  if args.verbose:
    lines.append("sources:")
    lines += [f"  {k}: {v}" for k, v in facts.sources.items()]
  out.write("\n".join(lines) + "\n")
  return ExitCode.OK
