"""pallas_kernels from the command line.

Usage:
  python -m pallas_kernels compile-report [--case SUBSTRING] [--no-jax] [--json]

compile-report: compiles every Mosaic GPU kernel at its default config through
XLA for an H200 on this machine (no GPU needed: the CUDA plugin wheels of the
installed jax and nvidia-cuda-nvcc-cu12) and prints ptxas's registers and
spills, the shared memory and the wgmma count per kernel, beside JAX's own
`hopper_matmul_mgpu` at its configuration. Run with JAX_PLATFORMS=cpu.
Example:
  JAX_PLATFORMS=cpu python -m pallas_kernels compile-report --case "bf16 4096"

Exit status: 0 when every default config fits (no spill, shared memory within
the H200's opt-in limit), 1 when one does not, 2 when this machine cannot
compile for a GPU (the line says which pip command fixes it).
"""

from __future__ import annotations

import argparse
import sys


def _compile_report(args: argparse.Namespace) -> int:
  from pallas_kernels._src import compat  # noqa: PLC0415
  from pallas_kernels._src.audit import topology  # noqa: PLC0415
  reason = topology.unavailable_reason() or compat.mosaic_gpu_unavailable_reason()
  if reason:
    print(f"compile-report: cannot compile for an H200 here: {reason}", file=sys.stderr)
    return 2
  from pallas_kernels._src import compile_report  # noqa: PLC0415
  cases = [c for c in compile_report.default_cases() if args.case in c.name]
  ours = compile_report.report(cases)
  theirs = None if args.no_jax else compile_report.report(compile_report.jax_reference_cases())
  if args.json:
    import dataclasses, json  # noqa: E401, PLC0415
    print(json.dumps({name: {"rows": [dataclasses.asdict(r) for r in rep.rows],
                             "notes": rep.notes, "errors": rep.errors, "fits": rep.fits}
                      for name, rep in (("ours", ours), ("jax", theirs)) if rep is not None},
                     indent=1))
    return 0 if ours.fits else 1
  print(f"Mosaic GPU kernels compiled for {compile_report.ARCH} (H200 topology; shared "
        f"memory limit {compile_report.SMEM_LIMIT} B)")
  print(compile_report.format_table(ours.rows))
  for case, note in ours.notes:
    print(f"note: {case}: {note}")
  for case, error in ours.errors:
    print(f"DID NOT COMPILE: {case}: {error}")
  if theirs is not None:
    print("\nJAX's hopper_matmul_mgpu at its configuration")
    print(compile_report.format_table(theirs.rows))
  bad = [r for r in ours.rows if not r.fits]
  print(f"\n{len(ours.rows)} kernels compiled, {len(bad)} spill or exceed shared memory, "
        f"{len(ours.errors)} cases did not compile")
  return 0 if ours.fits else 1


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m pallas_kernels",
                                   description=__doc__.splitlines()[0])
  verbs = parser.add_subparsers(dest="verb", required=True)
  report = verbs.add_parser("compile-report", help="compile the Mosaic GPU kernels for an H200")
  report.add_argument("--case", default="", help="only cases whose name contains this")
  report.add_argument("--no-jax", action="store_true",
                      help="skip JAX's hopper_matmul_mgpu comparison")
  report.add_argument("--json", action="store_true", help="the tables as JSON")
  args = parser.parse_args(argv)
  return _compile_report(args)


if __name__ == "__main__":
  sys.exit(main())
