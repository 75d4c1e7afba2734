"""The kernel library hlo-audit consults: which op closes a finding, the call
to paste, the ops sweeps target, swap and verify.

Every answer is read from the ops' specs (`registry`), so an op added as a
folder is offered to the audit with no edit here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from hlo_audit import plugins

from pallas_kernels._src import registry
from pallas_kernels._src.spec import CallFacts, OpSpec, channel_statistics, group_statistics

#: The library's name: its ops are "pallas_kernels.<op>".
NAME = "pallas_kernels"

#: Finding classes whose call is written from the matmul that writes the
#: boundary (epilogues) or reads it (prologues).
_WRITER_ANCHORED = frozenset({"unfused-epilogue"})
_READER_ANCHORED = frozenset({"unfused-prologue"})


#: Anchors no op here computes, and why the gap stays XLA's (the audit says
#: so instead of "no kernel yet").
_UNCOVERED = {
    "convolution": "no pallas_kernels convolution fuses this work: conv2d takes a "
                   "per-channel affine, an activation and zero padding on load, a "
                   "bias, activation and residual on store, and batch-norm sums "
                   "beside; the rest stays cuDNN's or XLA's",
    "batch_norm_stats": "no pallas_kernels kernel sums these batch statistics where "
                        "their operand is written: conv2d(statistics=True) does beside "
                        "a convolution, and batch_norm reads its x again for them",
    "column_reduction": "no pallas_kernels op computes this column sum: no gemm reads "
                        "the summed operand (a matmul's w_column_sum would), and no "
                        "row norm's backward writes it (its kernel sums gamma's gradient), "
                        "and it is no batch norm's sum over every axis but the last of an "
                        "NHWC-like operand (batch_norm's backward sums those)",
}


#: Work whose argument is an activation's name, kept: only some are supported.
_NAMED_ACTIVATION = ("activation", "activation_grad")


def _work(ops: tuple[str, ...]) -> tuple[str, ...]:
  """The fused work as an op's `Closes` lists it: "cast:bf16" -> "cast"
  (an activation, or its derivative, keeps its name: only some are
  supported); the outputs the readers write ("outputs:2") are
  `need.outputs`, not work."""
  return tuple(w if w.partition(":")[0] in _NAMED_ACTIVATION else w.split(":")[0]
               for w in ops if not w.startswith("outputs:"))


def _for_backward(c, need: plugins.KernelNeed, kept: bool) -> bool:
  """Whether the readers' outputs beyond the epilogue's are values kept for
  the backward pass that `c`'s own backward does without: the result stays
  stored for the gradients (`kept`), the epilogue has a derivative to take
  (an activation), and the op keeps its product for that."""
  return (kept and c.stores_result and
          any(w.startswith("activation:") for w in need.ops))


def _covers(spec: OpSpec, need: plugins.KernelNeed, kept: bool = False) -> tuple[bool, str]:
  """(whether `spec` closes `need`, why not when it comes close); `kept`:
  the finding's boundary stays stored for later readers (gradients). An op
  closing several families of findings closes the need when one of them
  does; otherwise the first reason any of them gives is its."""
  why = ""
  for c in spec.closings():
    ok, reason = _closes(f"{NAME}.{spec.name}", c, need, kept)
    if ok:
      return True, ""
    why = why or reason
  return False, why


def _closes(op: str, c, need: plugins.KernelNeed, kept: bool) -> tuple[bool, str]:
  """`_covers` for one family of findings `c` (a `Closes`) of op `op`."""
  if need.anchor in c.declines:
    return False, f"{op} {c.declines[need.anchor]}"
  if need.anchor not in c.anchors:
    return False, ""
  if not c.requires <= {item.partition(":")[0] for item in _work(need.ops)}:
    return False, ""  # Not close: the work that makes the op's anchor its own is absent.
  if need.reads_parts and not c.reads_parts:
    return False, f"{op} takes whole operands"
  if need.kind.slug not in c.kinds:
    return False, ""
  if need.outputs > c.outputs and not _for_backward(c, need, kept):
    return False, f"{op} writes {'one output' if c.outputs == 1 else f'{c.outputs} outputs'}"
  if c.statistics == "all but last axis" and not channel_statistics(need.statistics):
    return False, ""  # Another column sum (a dense bias's gradient): not close.
  if c.statistics == "per sample and group" and need.statistics is not None and \
      group_statistics(need.statistics) is None:
    return False, ""  # Per-sample statistics of no channel groups: not close.
  why = _statistics_mismatch(c.statistics, need.statistics)
  if why:
    return False, f"{op} {why}"
  allowed = c.epilogues | c.prologues
  for item in _work(need.ops):
    base, _, arg = item.partition(":")
    if base not in allowed or (base in _NAMED_ACTIVATION and arg
                               and arg not in c.activations):
      return False, ""
  return True, ""


def _statistics_mismatch(computes: str, stats) -> str:
  """Why an op computing `computes` statistics would change the numbers of a
  reduction over `stats` (`plugins.Statistics`); "" when they are the same."""
  if stats is None or computes != "last axis":
    return ""
  if stats.row:
    return ""
  n = stats.dims[-1] if stats.dims else 0
  return (f"reduces the last axis only ({n} elements per statistic); this one "
          f"reduces {stats.describe()}")


class PallasKernels:
  """`hlo_audit.plugins.KernelLibrary` for pallas_kernels."""

  name = NAME
  scope_prefix = NAME + "."

  def kernel_for(self, finding) -> plugins.KernelChoice:
    need = finding.need
    why = ""
    if need is None:
      return plugins.KernelChoice(None)
    for spec in registry.specs().values():
      ok, reason = _covers(spec, need, finding.boundary_kept)
      if ok:
        return plugins.KernelChoice(f"{NAME}.{spec.name}")
      why = why or reason
    return plugins.KernelChoice(None, why or _UNCOVERED.get(need.anchor, ""))

  def suggest(self, finding, module, *, device=None) -> plugins.Suggestion | None:
    op = (finding.kernel or "").removeprefix(self.scope_prefix)
    spec = registry.specs().get(op)
    if spec is None or spec.suggest is None:
      return None
    try:
      facts = _facts(finding, module)
      call = spec.suggest(facts)
    except (KeyError, IndexError, ValueError):
      return None  # An anchor this module does not let us read.
    if call is None:
      return None
    return plugins.Suggestion(call.text(NAME), _verdict(call, module, device))

  def sweep_targets(self) -> Mapping[str, Any]:
    from pallas_kernels._src.audit import sweep
    return {name: sweep.OpSweep(spec) for name, spec in registry.specs().items()
            if spec.make_case is not None and spec.sweep_params}

  def swap(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    from pallas_kernels._src.swap.rewrite import swap
    return swap(fn, **options)

  def verify(self, baseline, candidate, *args: Any, **options: Any):
    from pallas_kernels._src.audit.verify import verify
    return verify(baseline, candidate, *args, **options)


def _facts(finding, module) -> CallFacts:
  """What the audit reads of `finding` for an op's `suggest`."""
  kind = finding.kind.slug
  anchor = None
  if finding.need is not None and finding.need.anchor_kernel:
    anchor = plugins.matmul_anchor(module, finding.computation, finding.need.anchor_kernel)
  elif kind in _WRITER_ANCHORED:
    anchor = plugins.matmul_anchor(module, finding.computation, finding.producer)
  elif kind in _READER_ANCHORED and finding.consumers:
    anchor = plugins.matmul_anchor(module, finding.computation, finding.consumers[0])
  sources = (plugins.operand_arrays(module, finding.computation, finding.producer)
             if kind in _READER_ANCHORED else ())
  conv = pad = None
  if finding.need is not None and finding.need.anchor == "convolution":
    # The convolution: named by the need, else the reader of a prologue's
    # boundary, else its writer (an epilogue's, a statistic's).
    at = finding.need.anchor_kernel or (
        finding.consumers[0] if kind in _READER_ANCHORED and finding.consumers
        else finding.producer)
    conv = plugins.convolution_anchor(module, finding.computation, at)
    if kind in _READER_ANCHORED:
      pad = plugins.pad_widths(module, finding.computation, finding.producer)
  # The finding's work, and what its need adds (a column sum a gemm emits).
  ops = tuple(dict.fromkeys(finding.ops + (finding.need.ops if finding.need else ())))
  return CallFacts(kind=kind, ops=ops,
                   boundary=plugins.parse_array(finding.boundary_shape),
                   shape=finding.boundary_shape, matmul=anchor, sources=sources,
                   convolution=conv, pad=pad,
                   statistics=finding.need.statistics if finding.need else None,
                   epsilon=lambda: plugins.norm_epsilon(module),
                   numpy_name=plugins.numpy_dtype_name)


def _module_target(module, device=None):
  """The device an audited module was compiled for, when the audit names one
  (a `target` or `device_kind` attribute of the module, else the audited
  device's facts); None: this process's."""
  from pallas_kernels._src import backend
  named_by = [getattr(module, attr, None) for attr in ("target", "device_kind")]
  if device is not None and device.platform in ("gpu", "cpu", "tpu"):
    named_by.append(device.name)
  for named in named_by:
    if named:
      try:
        return backend.resolve_target(getattr(named, "device_kind", named))
      except (TypeError, ValueError):
        return None
  return None


def _verdict(call, module=None, device=None) -> str:
  """The op's guard on the call's shapes, asked without running it (once per
  distinct call and target: a model's layers repeat the same calls), for the
  device the audited module targets when it names one."""
  from pallas_kernels._src import backend
  return _verdict_on(call, _module_target(module, device) or backend.target())


@functools.lru_cache(maxsize=4096)
def _verdict_on(call, target) -> str:
  import jax
  import jax.numpy as jnp

  from pallas_kernels._src.swap.guard_check import check_guard

  try:
    def spec(dt, dims):
      return jax.ShapeDtypeStruct(dims, jnp.dtype(plugins.numpy_dtype_name(dt)))

    positional = [spec(dt, dims) for _, dt, dims, pos in call.arrays if pos]
    keywords = {name: spec(dt, dims) for name, dt, dims, pos in call.arrays if not pos}
    # Scales are stand-in values: the guard looks at shapes and dtypes.
    keywords.update((k, value) for k, _, value in call.options)
    check = check_guard(call.op, *positional, target=target, **keywords)
  except (TypeError, ValueError) as e:
    return f"guard not evaluated: {e}"
  mode = ", interpret mode" if check.interpret else ""
  if check.runs:
    built = f": {check.kernel_backend}" if check.kernel_backend else ""
    return f"kernel runs (guard passes on {check.backend}{mode}{built})"
  return f"falls back to XLA on {check.backend}{mode}: {check.reason}"


#: What the `hlo_audit.kernel_libraries` entry point names.
LIBRARY = PallasKernels()
