"""`hlo-audit example --swap`: swap the installed kernel library's kernels
into the built-in example, audit before and after, and run the acceptance gate.

With `--target h200` both programs are XLA's for that GPU (compiled here, no
GPU needed; numerics still run on this machine), and one more check holds:
the swapped program must hold the library's kernels as compiled kernels
(custom calls), and the what-if the audit of the original predicts for what
the swap changed must be within 5% of XLA's footprint of the swapped
program (`TargetCheck`): the findings it closed fused, and XLA's split-K
gemms at the lines it replaced run unsplit (a kernel that replaces a gemm,
forward or in its VJP, writes the [M, N] result once, not k partial sums).

The training step differentiates inside (`jax.value_and_grad(loss_fn)`), and
`swap` must see the forward program to recognise patterns, so the swapped
step is `value_and_grad(swap(loss_fn))` followed by the example's SGD update:
the same program `train_step` builds, with kernels in the forward and their
custom VJPs in the backward. The numerics gate holds it against the original
step.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from typing import Any

from hlo_audit._src.cli.common import ExitCode, UsageError

#: The what-if's predicted peak is judged within this of XLA's footprint.
WHAT_IF_TOLERANCE = 0.05
#: Finding classes a kernel swap closes (the what-if fuses these away).
_SWAP_CLASSES = ("unfused-epilogue", "unfused-prologue", "separate-reduction")


def swap_library():
  """The first installed kernel library that swaps and verifies.

  Raises:
    UsageError: when none is installed, saying why loading found none.
  """
  from hlo_audit._src.analysis.kernel_library import installed_libraries

  libs = installed_libraries()
  if not libs.swapping:
    raise UsageError("--swap needs a kernel library: " + "; ".join(libs.notes))
  return libs.swapping[0]


def _concrete_args(cfg) -> tuple[Any, Any]:
  import jax

  from hlo_audit._src.examples import transformer

  params = transformer.init_params(cfg, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.batch, cfg.seq), 0, cfg.vocab)
  return params, tokens


def swapped_example(fn, cfg, interpret: bool | None = None, target: str | None = None):
  """(baseline, swapped, swapped loss) callables of (params, tokens) for the
  example's jitted function `fn` (train_step or loss_fn, cfg static). The
  swapped function runs here (the numerics gate) and compiles for a GPU
  target (the audit): the library builds each kernel for both, the
  lowering keeping the one of the device compiled for. `target` ("h200")
  plans and builds for that device alone instead: the program compiles for
  it, and runs nowhere else."""
  import jax

  from hlo_audit._src.examples import transformer

  raw = getattr(fn, "__wrapped__", fn)
  baseline = functools.partial(raw, cfg=cfg)
  options = {"target": target} if target is not None else {}
  loss = swap_library().swap(functools.partial(transformer.loss_fn, cfg=cfg),
                             interpret=interpret, **options)
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
          "bytes_saved": report.bytes_saved, "findings": by_class,
          **({"platform": report.module.platform, "target": report.module.target}
             if report.module.target else {})}


@dataclasses.dataclass(frozen=True, slots=True)
class TargetCheck:
  """A swap compiled for a GPU target: are the kernels there, and does the
  what-if of the original predict the swapped program's peak?"""

  #: The target's label, e.g. "h200".
  target: str
  #: Ops the swap replaced.
  swapped_ops: int
  #: Kernels the swapped program for the target holds as custom calls
  #: (Pallas/Triton, Mosaic GPU), and those XLA got as interpret-mode loops.
  compiled_kernels: int
  interpreted_kernels: int
  #: Findings of the original the swap closed (the what-if fuses them).
  fused: int
  #: XLA split-K gemms of the original at the replaced lines (the what-if
  #: runs them unsplit).
  unsplit: int
  #: The original's peak, the what-if's prediction, and XLA's footprint of
  #: the swapped program (None when XLA gave none).
  baseline_peak: int
  predicted_peak: int
  measured_peak: int | None
  #: The compiled kernels by kind, e.g. {"Pallas/Mosaic GPU": 12}.
  kernel_kinds: dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def error(self) -> float | None:
    """(predicted - measured) / measured."""
    if not self.measured_peak:
      return None
    return (self.predicted_peak - self.measured_peak) / self.measured_peak

  @property
  def kernels_compiled(self) -> bool:
    return self.swapped_ops == 0 or self.compiled_kernels > 0

  @property
  def prediction_holds(self) -> bool:
    return self.error is not None and abs(self.error) <= WHAT_IF_TOLERANCE

  @property
  def passed(self) -> bool:
    return self.kernels_compiled and self.prediction_holds

  def lines(self) -> list[str]:
    from hlo_audit._src.report.units import fmt_bytes

    kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kernel_kinds.items()))
    kernels = (f"kernels on {self.target}: {self.compiled_kernels} compiled "
               f"({kinds or 'custom calls'}) for {self.swapped_ops} swapped ops")
    if not self.kernels_compiled:
      why = ("the library chose its backend from this machine, not from the target"
             if self.interpreted_kernels else
             "every swapped op runs XLA's ops on this target (the fallbacks above say why)")
      kernels += (f": FAIL, the swapped program holds none ({self.interpreted_kernels} "
                  f"ran as interpret-mode loops): {why}")
    err = self.error
    unsplit = f" and {self.unsplit} split-K gemms unsplit" if self.unsplit else ""
    what_if = (f"what-if on {self.target}: fusing the {self.fused} closed findings{unsplit} "
               f"predicts {fmt_bytes(self.predicted_peak)} (from {fmt_bytes(self.baseline_peak)}); "
               f"XLA's footprint of the swapped program "
               f"{fmt_bytes(self.measured_peak) if self.measured_peak else 'unknown'}")
    if err is not None:
      what_if += (f" ({100 * err:+.1f}%, tolerance {100 * WHAT_IF_TOLERANCE:.0f}%): "
                  f"{'pass' if self.prediction_holds else 'FAIL'}")
    if not self.kernels_compiled:
      what_if += (" (measured on interpret-mode loops, not kernels)" if self.interpreted_kernels
                  else " (measured on XLA's fallbacks, not kernels)")
    return [kernels, what_if]

  def to_dict(self) -> dict:
    return {**dataclasses.asdict(self), "error": self.error,
            "kernels_compiled": self.kernels_compiled,
            "prediction_holds": self.prediction_holds, "passed": self.passed}


def _same_file(a: str, b: str) -> bool:
  """The same file, one path perhaps relative to the other's root."""
  return a == b or (a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]
                    and (a.endswith(b) or b.endswith(a)))


def _at(buffer, locations) -> bool:
  """Whether a frame of `buffer`'s source is one of `locations` ((file,
  line) pairs)."""
  frames = [f for f in (buffer.source, *buffer.source_stack) if f is not None]
  return any(f.line == line and _same_file(f.file, file)
             for f in frames for file, line in locations)


def target_check(target: str, swapped_ops: int, before, after, diff,
                 locations=()) -> TargetCheck:
  """The `TargetCheck` of a swap from the audits of the two programs
  compiled for `target` and their diff; `locations`: the (file, line) pairs
  the replaced patterns cover."""
  from hlo_audit._src.analysis.backend_traits import KernelKind, user_kernel_of

  module = after.program.module if after.program is not None else None
  kinds: dict[str, int] = {}
  if module is not None:
    for c in module.computations:
      for i in c.instructions:
        kind = i.opcode == "custom-call" and user_kernel_of(i.custom_call_target or "")
        if kind:
          kinds[kind] = kinds.get(kind, 0) + 1
  compiled = sum(kinds.values())
  scoped = sum(1 for k in after.kernels if k.kind is KernelKind.PALLAS)
  gone = [f for f in diff.findings_removed if f.boundary and f.kind.slug in _SWAP_CLASSES]
  buffers = {b.name: b for b in before.buffers}
  unsplit = [s.partials for s in before.split_k if _at(buffers[s.partials], locations)]
  predicted = before.what_if(fuse=gone, unsplit=unsplit).peak_bytes
  return TargetCheck(
      target=target, swapped_ops=swapped_ops, compiled_kernels=compiled,
      interpreted_kernels=max(scoped - compiled, 0), fused=len(gone), unsplit=len(unsplit),
      baseline_peak=before.peak_bytes, predicted_peak=predicted,
      measured_peak=after.xla_peak_bytes, kernel_kinds=kinds)


def run_swap(fn, fn_args, args: argparse.Namespace, out=None, *, target=None) -> ExitCode:
  """Swaps kernels into the example, audits before/after and verifies.

  Args:
    fn: the example's jitted function (`static_argnums=(2,)` for its config).
    fn_args: (params, tokens, cfg), params and tokens may be abstract.
    args: the parsed CLI flags (`--json` is honoured).
    out: where to write (default stdout).
    target: a `hlo_audit.Target`: audit both programs as XLA compiles them
      for it, and add the `TargetCheck`.

  Returns:
    ExitCode.OK when the acceptance gate (and the target check) passes,
    ExitCode.FINDINGS otherwise.
  """
  from hlo_audit._src.report.units import fmt_bytes, fmt_delta_bytes

  library = swap_library()
  out = out or sys.stdout
  cfg = fn_args[2]
  params, tokens = _concrete_args(cfg)
  options = {} if target is None else {"target": target}
  planned = None
  if target is not None:
    try:
      # Planned and built for the target (its kernels, e.g. JAX's attention
      # kernel where this CPU's plan keeps XLA's), and the same plan
      # interpreted here for the numerics.
      planned = swapped_example(fn, cfg, target=target.name)
      options["here"] = swapped_example(fn, cfg, target=target.name, interpret=True)[1]
    except ValueError:
      pass  # A device the library does not plan for (it names those it knows).
  # Else planned here, each kernel built for every device.
  baseline, swapped, loss = planned or swapped_example(fn, cfg)
  report = loss.report(params, tokens)
  result = library.verify(baseline, swapped, params, tokens, swap_report=report, **options)
  before, after, diff = result.before, result.after, result.diff
  check = None
  if target is not None:
    replaced = getattr(report, "replaced", ())
    check = target_check(target.label, len(replaced), before, after, diff,
                         [loc for site in replaced for loc in getattr(site, "locations", ())])
  if getattr(args, "json", False):
    out.write(json.dumps({
        "swap": report.to_dict(), "before": _summary_dict(before),
        "after": _summary_dict(after), "diff": diff.to_dict(),
        "verification": result.to_dict(),
        **({"target_check": check.to_dict()} if check is not None else {})},
        indent=2) + "\n")
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
    if check is not None:
      lines += ["", f"target {target.label} (both programs compiled for it here):",
                *("  " + line for line in check.lines())]
    out.write("\n".join(lines) + "\n")
  failed = False
  if not result.passed:
    print(f"hlo-audit: verification failed: {result.verdict}", file=sys.stderr)
    failed = True
  if check is not None and not check.passed:
    print(f"hlo-audit: target check failed on {target.label}: "
          + ("no compiled kernel in the swapped program" if not check.kernels_compiled
             else "the what-if prediction is off by more than "
                  f"{100 * WHAT_IF_TOLERANCE:.0f}%"), file=sys.stderr)
    failed = True
  return ExitCode.FINDINGS if failed else ExitCode.OK
