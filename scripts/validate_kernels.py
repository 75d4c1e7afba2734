"""Validate Pallas kernels against their XLA references; exit 1 on any failure.

Runs `pallas_kernels.validate` over the registered ops (or `--ops`) and the
cases of `--tags`, prints the table (kernel error next to XLA's own error,
gradient error, written/non-finite/repeat checks, guard fallbacks), and writes
it to `--out` as Markdown (`.md`) plus JSON (`.json`) when given. Also fails
when an op's arg_specs module exists but cannot be imported.

Usage:
  python scripts/validate_kernels.py --ops=layer_norm,rms_norm,softmax \
      --tags=ci,grad,nonfinite --out=out/validate

On a machine without GPU the kernels run in Pallas interpret mode; pass
`--interpret=false` on a GPU to insist on compiled kernels.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from absl import app
from absl import flags

# Runnable from a checkout without installing the package.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import pallas_kernels as pk  # noqa: E402
from pallas_kernels._src import registry  # noqa: E402


def _define_flags() -> None:
  # Defined only when run as a script, so tests can import run() without
  # clashing with other scripts' flags of the same names.
  flags.DEFINE_list("ops", None, "Ops to validate (default: all registered).")
  flags.DEFINE_list("tags", ["ci"], "Case tags to run (ci, grad, nonfinite, bench).")
  flags.DEFINE_list("dtypes", None, "Keep only cases of these input dtypes.")
  flags.DEFINE_string("out", None, "Write <out>.md and <out>.json here.")
  flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
  flags.DEFINE_enum("interpret", "auto", ["auto", "true", "false"],
                    "Pallas interpret mode (auto: without GPU/TPU).")
  flags.DEFINE_enum("require_kernel", "auto", ["auto", "true", "false"],
                    "Fail a case that fell back to XLA (auto: where kernels compile).")
  flags.DEFINE_boolean("grads", True, "Also check gradients.")


def run(ops: list[str] | None, tags: list[str], *, dtypes=None, out: str | None = None,
        seed: int = 0, interpret: bool | None = None, check_grads: bool = True,
        require_kernel: bool | None = None) -> int:
  """Validates, prints and writes the report; returns the exit status."""
  errors = dict(registry.load_errors())
  for module, error in errors.items():
    print(f"ERROR: {module} failed to import: {error!r}", file=sys.stderr)
  names = ops or list(registry.spec_names())
  report = pk.validate(names, tags=tags, dtypes=dtypes, seed=seed, interpret=interpret,
                       check_grads=check_grads, require_kernel=require_kernel)
  print(report)
  if out:
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".md").write_text(report.to_markdown() + "\n")
    path.with_suffix(".json").write_text(json.dumps({
        "passed": report.passed, "interpret": report.interpret, "device": report.device,
        "require_kernel": report.require_kernel,
        "rows": [dict(dataclasses.asdict(r), passed=r.passed) for r in report.rows],
    }, indent=2))
  return 0 if report.passed and not errors else 1


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  choice = {"auto": None, "true": True, "false": False}
  f = flags.FLAGS
  sys.exit(run(f.ops, f.tags, dtypes=f.dtypes, out=f.out, seed=f.seed,
               interpret=choice[f.interpret], check_grads=f.grads,
               require_kernel=choice[f.require_kernel]))


if __name__ == "__main__":
  _define_flags()
  app.run(main)
