"""`python -m pallas_kernels validate`: the kernels against their XLA references.

Runs `pallas_kernels.validate` over the registered ops (or `--ops`) and the
cases of `--tags`, prints the table (kernel error next to XLA's own error,
gradient error, written/non-finite/repeat checks, guard fallbacks), and writes
it to `--out` as Markdown (`.md`) plus JSON (`.json`) when given. Also fails
when an op's arg_specs module exists but cannot be imported. Without a GPU
the kernels run in Pallas interpret mode; on a GPU, `--interpret=false
--require-kernel=true` insists on compiled kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

from pallas_kernels._src.cli.common import (TRI_STATE, ExitCode, UsageError, add_grads_flag,
                                            comma_list, flag_names, selected_ops)

_EXAMPLE = ("python -m pallas_kernels validate --ops=layer_norm,rms_norm,softmax "
            "--tags=ci,grad,nonfinite --out=out/validate")


def add_parser(sub) -> None:
  p = sub.add_parser(
      "validate", help="hold the kernels against their XLA references (exit 1 on a failure)",
      description=__doc__.split("\n\n", 1)[1], epilog=f"example: {_EXAMPLE}")
  p.add_argument("--ops", type=comma_list, default=None, metavar="OP,...",
                 help="ops to validate (default: every registered op)")
  p.add_argument("--tags", type=comma_list, default=["ci"], metavar="TAG,...",
                 help="case tags to run: ci, grad, nonfinite, bench, ... (default: ci)")
  p.add_argument("--dtypes", type=comma_list, default=None, metavar="DTYPE,...",
                 help="keep only cases of these input dtypes")
  p.add_argument("--out", metavar="PATH", help="write PATH.md and PATH.json")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
  p.add_argument("--interpret", choices=TRI_STATE, default="auto",
                 help="Pallas interpret mode (auto: without a GPU or TPU)")
  p.add_argument(*flag_names("require_kernel"), dest="require_kernel", choices=TRI_STATE,
                 default="auto",
                 help="fail a case that fell back to XLA (auto: where kernels compile)")
  add_grads_flag(p)
  p.add_argument("--target", metavar="NAME", default=None,
                 help="build the kernels for this device: a GPU (h200, a100, ...) or tpu "
                      "(Mosaic TPU kernels); interpreted on a machine without it")
  p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> ExitCode:
  """Validates, prints and writes the report."""
  from pallas_kernels._src import backend  # noqa: PLC0415 - imports JAX
  from pallas_kernels._src import registry  # noqa: PLC0415
  from pallas_kernels._src import validate as validate_lib  # noqa: PLC0415

  errors = dict(registry.load_errors())
  for module, error in errors.items():
    print(f"ERROR: {module} failed to import: {error!r}", file=sys.stderr)
  names = selected_ops(args.ops)
  dtypes = _dtypes(args.dtypes)
  interpret = TRI_STATE[args.interpret]
  try:
    target = backend.resolve_target(args.target)
  except ValueError as e:
    raise UsageError(str(e)) from None
  if target is not None and target.abstract:
    # No such device here: its kernels can only run in their interpret mode.
    if interpret is False:
      raise UsageError(f"--interpret=false needs a {target.device_kind} on this machine")
    interpret = True
  try:
    report = validate_lib.validate(
        names, tags=args.tags, dtypes=dtypes, seed=args.seed, interpret=interpret,
        check_grads=args.grads, require_kernel=TRI_STATE[args.require_kernel],
        target=target)
  except registry.NoCasesError as e:
    raise UsageError(str(e)) from None
  print(report)
  if args.out:
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".md").write_text(report.to_markdown() + "\n")
    path.with_suffix(".json").write_text(json.dumps({
        "passed": report.passed, "interpret": report.interpret, "device": report.device,
        "require_kernel": report.require_kernel,
        "rows": [dict(dataclasses.asdict(r), passed=r.passed) for r in report.rows],
    }, indent=2))
  return ExitCode.OK if report.passed and not errors else ExitCode.FAILED


def _dtypes(names: list[str] | None) -> list[str] | None:
  import jax.numpy as jnp  # noqa: PLC0415

  for name in names or ():
    try:
      jnp.dtype(name)
    except TypeError:
      raise UsageError(f"--dtypes: {name!r} is not a dtype (float32, bfloat16, ...)") from None
  return names
