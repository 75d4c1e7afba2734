"""`python -m pallas_kernels compile-report`: the kernels compiled for a GPU, here.

No GPU needed. `--backend mosaic_gpu` (the default): every Mosaic GPU kernel
at its default config, compiled through XLA for an H200 (the CUDA plugin
wheels of the installed jax and nvidia-cuda-nvcc-cu12; run with
JAX_PLATFORMS=cpu), with ptxas's registers and spills, the shared memory and
the wgmma count per kernel, beside JAX's own `hopper_matmul_mgpu` at its
configuration. `--backend triton`: every Triton kernel's IR compiled for
sm_90a and sm_80 (`--arch`) with the `triton` package (it ships ptxas; it
reads the IR of JAX 0.12 with Triton 3.9), with registers, spills, shared
memory and the dot unit (wgmma, mma, fma).

Exit status: 0 when every default config fits (no spill, shared memory within
the GPU's opt-in limit), 1 when one does not, 2 when this machine cannot
compile for a GPU (the line says what to install).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from pallas_kernels._src.cli.common import ExitCode, UsageError

_EXAMPLE = 'JAX_PLATFORMS=cpu python -m pallas_kernels compile-report --case "bf16 4096"'
BACKENDS = ("mosaic_gpu", "triton")


def add_parser(sub) -> None:
  p = sub.add_parser(
      "compile-report", help="compile the kernels for a GPU on this machine: registers, "
      "spills, shared memory", description=__doc__.split("\n\n", 1)[1],
      epilog=f"example: {_EXAMPLE}")
  p.add_argument("--backend", choices=BACKENDS, default="mosaic_gpu",
                 help="which kernels: Mosaic GPU's for an H200 (default) or Triton's")
  p.add_argument("--case", default="", help="only cases whose name contains this")
  p.add_argument("--json", action="store_true", help="the tables as JSON")
  p.add_argument("--no-jax", action="store_true",
                 help="mosaic_gpu: skip JAX's hopper_matmul_mgpu comparison")
  p.add_argument("--arch", action="append", metavar="ARCH",
                 help="triton: compile target, sm_90a or sm_80 (repeatable; default: both)")
  p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> ExitCode:
  if args.backend == "triton":
    if args.no_jax:
      raise UsageError("--no-jax applies to --backend mosaic_gpu")
    return _triton(args)
  if args.arch:
    raise UsageError("--arch applies to --backend triton (the Mosaic GPU kernels are "
                     "for sm_90a)")
  return _mosaic_gpu(args)


def _mosaic_gpu(args: argparse.Namespace) -> ExitCode:
  from pallas_kernels._src import compat  # noqa: PLC0415 - imports JAX
  from pallas_kernels._src.audit import topology  # noqa: PLC0415
  reason = topology.unavailable_reason() or compat.mosaic_gpu_unavailable_reason()
  if reason:
    raise UsageError(f"cannot compile for an H200 here: {reason}")
  from pallas_kernels._src import compile_report  # noqa: PLC0415
  cases = [c for c in compile_report.default_cases() if args.case in c.name]
  ours = compile_report.report(cases)
  theirs = None if args.no_jax else compile_report.report(compile_report.jax_reference_cases())
  _say_sass_skipped([r for r in (ours, theirs) if r is not None])
  if args.json:
    print(json.dumps({name: {"rows": [dataclasses.asdict(r) for r in rep.rows],
                             "notes": rep.notes, "errors": rep.errors, "fits": rep.fits}
                      for name, rep in (("ours", ours), ("jax", theirs)) if rep is not None},
                     indent=1))
    return ExitCode.OK if ours.fits else ExitCode.FAILED
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
  return ExitCode.OK if ours.fits else ExitCode.FAILED


def _say_sass_skipped(reports) -> None:
  """One line on stderr for every kernel whose SASS Mosaic GPU's dump could
  not list (the report reads ptxas's output and the PTX, never SASS)."""
  skipped = sum(r.sass_skipped for r in reports)
  if skipped:
    reason = next(r.sass_reason for r in reports if r.sass_reason)
    print(f"note: nvdisasm could not disassemble {skipped} kernels ({reason}): SASS "
          "listing skipped; the report does not use it", file=sys.stderr)


def _triton(args: argparse.Namespace) -> ExitCode:
  from pallas_kernels._src import gpu_report  # noqa: PLC0415 - imports JAX
  unknown = sorted(set(args.arch or ()) - set(gpu_report.ARCHS))
  if unknown:
    raise UsageError(f"unknown --arch {', '.join(unknown)}; known: "
                     f"{', '.join(sorted(gpu_report.ARCHS))}")
  if not gpu_report.triton_available():
    raise UsageError("the `triton` package is not installed: pip install "
                     "'hlo-audit[gpu-report]'")
  cases = [c for c in gpu_report.default_cases() if args.case in c.name]
  try:
    result = gpu_report.report(cases, tuple(args.arch or gpu_report.ARCHS))
  except gpu_report.IrUnreadable as e:
    raise UsageError(str(e)) from None
  bad = [r for r in result.rows if not r.fits]
  if args.json:
    print(json.dumps({"rows": [dataclasses.asdict(r) for r in result.rows],
                      "fallbacks": result.fallbacks, "fits": not bad}, indent=1))
    return ExitCode.FAILED if bad else ExitCode.OK
  print(gpu_report.format_table(result.rows))
  for case, arch, reason in result.fallbacks:
    print(f"no kernel: {case} on {arch} falls back to XLA: {reason}")
  print(f"\n{len(result.rows)} kernels compiled, {len(bad)} spill or overflow shared memory")
  return ExitCode.FAILED if bad else ExitCode.OK
