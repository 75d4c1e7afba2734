"""`hlo-audit example --swap`: swap the installed kernel library's kernels
into the built-in example, audit before and after, and run the acceptance gate.

The training step differentiates inside (`jax.value_and_grad(loss_fn)`), and
`swap` must see the forward program to recognise patterns, so the swapped
step is `value_and_grad(swap(loss_fn))` followed by the example's SGD update:
the same program `train_step` builds, with kernels in the forward and their
custom VJPs in the backward. The numerics gate holds it against the original
step.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Any

from hlo_audit._src.cli.common import ExitCode, UsageError


def swap_library():
  """The first installed kernel library (it swaps and verifies).

  Raises:
    UsageError: when none is installed, saying why loading found none.
  """
  from hlo_audit._src.analysis.kernel_library import installed_libraries

  libs = installed_libraries()
  if not libs.libraries:
    raise UsageError("--swap needs a kernel library: " + "; ".join(libs.notes))
  return libs.libraries[0]


def _concrete_args(cfg) -> tuple[Any, Any]:
  import jax

  from hlo_audit._src.examples import transformer

  params = transformer.init_params(cfg, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.batch, cfg.seq), 0, cfg.vocab)
  return params, tokens


def swapped_example(fn, cfg, interpret: bool | None = None):
  """(baseline, swapped, swapped loss) callables of (params, tokens) for the
  example's jitted function `fn` (train_step or loss_fn, cfg static)."""
  import jax

  from hlo_audit._src.examples import transformer

  raw = getattr(fn, "__wrapped__", fn)
  baseline = functools.partial(raw, cfg=cfg)
  loss = swap_library().swap(functools.partial(transformer.loss_fn, cfg=cfg),
                             interpret=interpret)
  if raw is transformer.loss_fn:
    return baseline, loss, loss

  def step(params, tokens, lr: float = 1e-3):
    # transformer.train_step with the swapped loss.
    value, grads = jax.value_and_grad(loss)(params, tokens)
    new = jax.tree.map(lambda p, g: (p - lr * g.astype("float32")).astype(p.dtype),
                       params, grads)
    return value, new

  return baseline, step, loss


def _summary_dict(report) -> dict:
  by_class: dict[str, int] = {}
  for f in report.findings:
    by_class[f.kind.slug] = by_class.get(f.kind.slug, 0) + 1
  return {"module": report.module.name, "kernels": len(report.kernels),
          "kernels_by_kind": dict(report.kernels_by_kind()),
          "peak_bytes": report.peak_bytes,
          "materialized_bytes": report.materialized_bytes,
          "bytes_saved": report.bytes_saved, "findings": by_class}


def run_swap(fn, fn_args, args: argparse.Namespace, out=None, *, target=None) -> ExitCode:
  """Swaps kernels into the example, audits before/after and verifies.

  Args:
    fn: the example's jitted function (`static_argnums=(2,)` for its config).
    fn_args: (params, tokens, cfg), params and tokens may be abstract.
    args: the parsed CLI flags (`--json` is honoured).
    out: where to write (default stdout).

  Returns:
    ExitCode.OK when the acceptance gate passes, ExitCode.FINDINGS otherwise.
  """
  from hlo_audit._src.report.units import fmt_bytes, fmt_delta_bytes

  library = swap_library()
  out = out or sys.stdout
  cfg = fn_args[2]
  params, tokens = _concrete_args(cfg)
  baseline, swapped, loss = swapped_example(fn, cfg)
  report = loss.report(params, tokens)
  result = library.verify(baseline, swapped, params, tokens, swap_report=report)
  before, after, diff = result.before, result.after, result.diff
  if getattr(args, "json", False):
    out.write(json.dumps({
        "swap": report.to_dict(), "before": _summary_dict(before),
        "after": _summary_dict(after), "diff": diff.to_dict(),
        "verification": result.to_dict()}, indent=2) + "\n")
  else:
    gone = [f for f in diff.findings_removed if f.kind.slug in
            ("unfused-epilogue", "unfused-prologue", "separate-reduction")]
    lines = [str(report), "", "before:", before.summary(), "", "after:", after.summary(),
             "", f"diff: kernels {len(before.kernels)} -> {len(after.kernels)} "
             f"(launches per run {diff.launches_delta:+d}); materialized "
             f"{fmt_bytes(before.materialized_bytes)} -> {fmt_bytes(after.materialized_bytes)} "
             f"({fmt_delta_bytes(diff.materialized_bytes_delta)}); peak "
             f"{fmt_delta_bytes(diff.peak_bytes_delta)}",
             f"  findings gone ({len(gone)} fusion gaps):"]
    lines += [f"    - {f.kind.value}: {f.boundary_shape} at "
              f"{f.source.file.rsplit('/', 1)[-1] + ':' + str(f.source.line) if f.source else '?'}"
              f" ({fmt_bytes(f.bytes_saved)})" for f in gone]
    lines += ["", "verification (acceptance gate):", str(result)]
    out.write("\n".join(lines) + "\n")
  if not result.passed:
    print(f"hlo-audit: verification failed: {result.verdict}", file=sys.stderr)
    return ExitCode.FINDINGS
  return ExitCode.OK
