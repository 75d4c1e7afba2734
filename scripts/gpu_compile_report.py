"""Compile every kernel's Triton IR for sm_90a and sm_80 without a GPU.

Usage: python scripts/gpu_compile_report.py [--arch sm_90a] [--case SUBSTRING]

Prints registers, spill bytes, shared memory and the dot unit (wgmma, mma,
fma) per kernel and default config. Needs the `triton` package (it ships
ptxas) and a JAX whose Triton IR that Triton reads (JAX 0.12 with Triton 3.9).
Exit status 1 when a kernel spills or overflows shared memory.
"""

from __future__ import annotations

import argparse
import sys

from pallas_kernels._src import gpu_report


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--arch", action="append", choices=sorted(gpu_report.ARCHS),
                      help="compile target (repeatable; default: all)")
  parser.add_argument("--case", default="", help="only cases whose name contains this")
  args = parser.parse_args(argv)
  if not gpu_report.triton_available():
    print("gpu_compile_report: the `triton` package is not installed", file=sys.stderr)
    return 2
  cases = [c for c in gpu_report.default_cases() if args.case in c.name]
  try:
    result = gpu_report.report(cases, tuple(args.arch or gpu_report.ARCHS))
  except gpu_report.IrUnreadable as e:
    print(f"gpu_compile_report: {e}", file=sys.stderr)
    return 2
  rows = result.rows
  print(gpu_report.format_table(rows))
  for case, arch, reason in result.fallbacks:
    print(f"no kernel: {case} on {arch} falls back to XLA: {reason}")
  bad = [r for r in rows if not r.fits]
  print(f"\n{len(rows)} kernels compiled, {len(bad)} spill or overflow shared memory")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
