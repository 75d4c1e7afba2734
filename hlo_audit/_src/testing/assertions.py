"""Assertions that turn an audit into a test: a fusion won stays won.

Each takes a function and its arguments (audited as `hlo_audit.audit` does:
arrays or `jax.ShapeDtypeStruct`s, no data needed) or an `AuditReport`, and
raises `AssertionError` whose message lists the offending finding groups, one
line each with its source, so a failing test says what regressed and where.
`target="h200"` audits the program XLA compiles for that GPU (on any
machine: `hlo_audit.get_target`), so CI without a GPU can hold GPU fusions.
`min_time="5us"` keeps only groups whose estimated time saved per step
(`AuditReport.timing`) reaches it; a report without an estimate fails the
assertion rather than pass with nothing checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord
from hlo_audit._src.hlo.ir import HloModule
from hlo_audit._src.report import layout
from hlo_audit._src.report.grouping import ranked_groups
from hlo_audit._src.report.report import AuditReport, finding_kind
from hlo_audit._src.report.units import (fmt_bytes, fmt_source, fmt_time, parse_bytes,
                                         parse_time)

#: Width of assertion messages (pytest shows them as they are).
MESSAGE_WIDTH = 120

#: High-level op names and the JAX primitives or HLO opcodes that reveal them
#: inside a kernel (any one set, all of its members).
OP_SIGNATURES: dict[str, tuple[frozenset[str], ...]] = {
    "gelu": (frozenset({"erf"}), frozenset({"erfc"}), frozenset({"tanh", "integer_pow"}),
             frozenset({"tanh", "pow"})),
    "relu": (frozenset({"max"}), frozenset({"maximum"})),
    "silu": (frozenset({"logistic"}),),
    "sigmoid": (frozenset({"logistic"}),),
    "softmax": (frozenset({"reduce_max", "exp"}),),
    "dot": (frozenset({"dot"}), frozenset({"dot_general"}), frozenset({"convolution"}),
            frozenset({"conv_general_dilated"})),
}
OP_SIGNATURES["matmul"] = OP_SIGNATURES["dot"]

#: Words in a library call's detail that say it runs the op (cuBLASLt
#: epilogues such as "epilogue=BIAS_GELU", gemm custom calls).
_DETAIL_WORDS = {"gelu": ("GELU",), "relu": ("RELU",), "bias": ("BIAS",),
                 "dot": ("gemm", "matmul", "cublas", "conv"),
                 "matmul": ("gemm", "matmul", "cublas")}


@dataclasses.dataclass(frozen=True, slots=True)
class Audited:
  """A report and, when this module compiled the function, its HLO module."""

  report: AuditReport
  module: HloModule | None = None


def audited(fn_or_report: Any, *args: Any, target: Any = None) -> Audited:
  """Audits `fn_or_report` for `args`: a function, a Capture, a parsed
  HloModule, or an AuditReport (taken as is). `target`: the device to compile
  a function for (a name, a spec file or a `Target`; functions only)."""
  from hlo_audit._src.audit import audit_capture
  from hlo_audit._src.capture.capture import Capture, capture

  compiled = isinstance(fn_or_report, (AuditReport, Audited, HloModule, Capture))
  if target is not None and compiled:
    raise TypeError(f"target= compiles a function; a {type(fn_or_report).__name__} "
                    "is compiled already")
  if isinstance(fn_or_report, AuditReport):
    if args:
      raise TypeError("an AuditReport takes no further arguments")
    return Audited(fn_or_report)
  if isinstance(fn_or_report, Audited):
    return fn_or_report
  if isinstance(fn_or_report, HloModule):
    from hlo_audit._src.audit import audit_hlo
    return Audited(audit_hlo(fn_or_report), fn_or_report)
  cap = fn_or_report if isinstance(fn_or_report, Capture) else capture(
      fn_or_report, *args, target=target)
  return Audited(audit_capture(cap), cap.module)


def time_floor(report: AuditReport, min_time: float | str | None) -> float | None:
  """`min_time` in seconds (None: no time threshold).

  Raises:
    ValueError: for text that is not a time (`parse_time`).
    AssertionError: when a threshold is given and the report has no time
      estimate (the device is unknown): the threshold cannot be checked, and
      a gate that checked nothing must not pass.
  """
  if min_time is None:
    return None
  floor = parse_time(min_time)
  if report.timing is None:
    prefix = "time not estimated: "
    why = next((n[len(prefix):] for n in report.notes if n.startswith(prefix)),
               "the device is unknown")
    raise AssertionError(f"{report.module.name}: min_time={min_time!r} cannot be checked: "
                         f"the audit estimated no time: {why}")
  return floor


def select(report: AuditReport, kinds=None, min_bytes: int | str = 0,
           where: str | Callable[[FusionDecisionRecord], bool] | None = None,
           min_time: float | str | None = None):
  """The ranked finding groups that propose a change, of `kinds` (classes or
  slugs; default all), at a source matching `where` (a substring of
  `path:line` or a predicate on the record), saving at least `min_bytes`
  per run and, when given, `min_time` per step (seconds, or "5us", "1.5ms")
  as a group. A group the time model could not price is kept: it is not
  known to be below `min_time`.

  Raises:
    AssertionError: for `min_time` on a report without a time estimate.
  """
  floor = parse_bytes(min_bytes)
  time_min = time_floor(report, min_time)
  wanted = None if kinds is None else {_kind(k) for k in _iter(kinds)}
  records = [f for f in report.findings if _matches(f, where)]
  return [g for g in ranked_groups(records)
          if g.actionable and (wanted is None or g.kind in wanted) and g.bytes_saved >= floor
          and time_reaches(g.time_saved, time_min)]


def time_reaches(saved: float | None, floor: float | None) -> bool:
  """Whether a group's time saved passes a `min_time` floor (None: no floor;
  an unpriced group passes)."""
  return floor is None or saved is None or saved >= floor


def assert_no_findings(fn_or_report: Any, *args: Any, kinds=None,
                       min_bytes: int | str = 0,
                       where: str | Callable[[FusionDecisionRecord], bool] | None = None,
                       target: Any = None, min_time: float | str | None = None
                       ) -> AuditReport:
  """Fails when the audit finds a fusion gap.

  Args:
    fn_or_report: a function (jitted or not), a Capture, a parsed HloModule,
      or an AuditReport.
    *args: the function's arguments (arrays or `jax.ShapeDtypeStruct`s).
    kinds: finding classes to check ("unfused-epilogue", `FindingKind`s);
      default: every class that proposes a change.
    min_bytes: ignore groups saving less per run (int or "1MiB").
    min_time: ignore groups whose estimated time saved per step is less
      (seconds, or "5us", "1.5ms", "2s"); it fails when the report has no
      time estimate (the device is unknown), as nothing could be checked.
    where: only findings whose source contains this text (e.g. "model.py:42"
      or "model.py"), or for which this predicate is true.
    target: compile the function for this device instead of this machine's
      ("h200", a spec file, a `hlo_audit.Target`); the same in every
      assertion here.

  Returns:
    The report, for further checks.
  """
  __tracebackhide__ = True  # pytest shows the caller's line, not ours
  a = audited(fn_or_report, *args, target=target)
  groups = select(a.report, kinds, min_bytes, where, min_time)
  if groups:
    what = ", ".join(sorted({g.kind.slug for g in groups}))
    floor = "" if min_time is None else (
        f" saving at least {fmt_time(parse_time(min_time))} per step on "
        f"{a.report.timing.facts.name}")
    raise AssertionError(_message(
        a.report, f"{sum(g.count for g in groups)} finding(s) ({what}) in "
        f"{len(groups)} group(s){floor}", groups))
  return a.report


def assert_no_copies(fn_or_report: Any, *args: Any, min_bytes: int | str = 0,
                     where=None, target: Any = None,
                     min_time: float | str | None = None) -> AuditReport:
  """Fails on standalone copies or transposes and on layout conflicts."""
  __tracebackhide__ = True  # pytest shows the caller's line, not ours
  return assert_no_findings(fn_or_report, *args, min_bytes=min_bytes, where=where,
                            kinds=(FindingKind.STANDALONE_COPY, FindingKind.LAYOUT_CONFLICT),
                            target=target, min_time=min_time)


def assert_peak_below(fn_or_report: Any, *args: Any, bytes: int | str,  # noqa: A002
                      target: Any = None) -> AuditReport:
  """Fails when the audit's peak memory (XLA's accounting) reaches `bytes`;
  the message lists the largest buffers live at the peak."""
  __tracebackhide__ = True  # pytest shows the caller's line, not ours
  a = audited(fn_or_report, *args, target=target)
  r, limit = a.report, parse_bytes(bytes)
  if r.peak_bytes < limit:
    return r
  live = set(r.live_at_peak)
  biggest = sorted((b for b in r.buffers if b.name in live), key=lambda b: -b.bytes)[:10]
  rows = [(fmt_bytes(b.bytes), b.shape, b.lifetime.value, fmt_source(b.source) or "?")
          for b in biggest]
  from hlo_audit._src.report.layout import Column
  lines = layout.table((Column("bytes", "num"), Column("shape", "name"),
                        Column("lifetime", "text"), Column("source", "source")),
                       rows, MESSAGE_WIDTH, title=f"largest of {len(live)} buffers live at the peak:")
  raise AssertionError(
      f"{r.module.name}: peak {fmt_bytes(r.peak_bytes)} is not below {fmt_bytes(limit)} "
      f"({r.peak_bytes} >= {limit} bytes)\n" + "\n".join(lines))


def assert_kernel_count(fn_or_report: Any, *args: Any, at_most: int | None = None,
                        at_least: int | None = None, target: Any = None) -> AuditReport:
  """Fails when the program launches more than `at_most` (or fewer than
  `at_least`) kernels; a kernel inside a loop body counts once."""
  __tracebackhide__ = True  # pytest shows the caller's line, not ours
  if at_most is None and at_least is None:
    raise TypeError("assert_kernel_count needs at_most= or at_least=")
  if at_most is not None and at_least is not None and at_least > at_most:
    raise TypeError(f"assert_kernel_count: at_least={at_least} is above at_most={at_most}: "
                    "no count passes")
  a = audited(fn_or_report, *args, target=target)
  n = len(a.report.kernels)
  if (at_most is None or n <= at_most) and (at_least is None or n >= at_least):
    return a.report
  bound = f"at most {at_most}" if at_most is not None and n > at_most else f"at least {at_least}"
  kinds = ", ".join(f"{c} {k}" for k, c in a.report.kernels_by_kind().items())
  groups = select(a.report)
  raise AssertionError(_message(
      a.report, f"{n} kernels ({kinds}), expected {bound}; fusion gaps that add launches",
      groups))


def assert_fused(fn_or_report: Any, *args: Any, op: str, into: str = "dot",
                 where: str | Callable[[FusionDecisionRecord], bool] | None = None,
                 target: Any = None) -> AuditReport:
  """Fails unless every kernel that runs `op` also runs `into`: the op is
  fused into the matmul's kernel, not applied to its result in another.

  `op` and `into` are JAX primitive names or HLO opcodes ("tanh", "add",
  "dot_general"), or one of OP_SIGNATURES' names ("gelu", "relu", "silu",
  "softmax", "dot"/"matmul"). It fails too when no kernel runs `op` (nothing
  would be checked), and on unfused-epilogue or unfused-prologue findings
  naming the op. With a report instead of a function, kernels are read from
  their fused opcodes and library details only.
  """
  __tracebackhide__ = True  # pytest shows the caller's line, not ours
  a = audited(fn_or_report, *args, target=target)
  r = a.report
  sig = {k.name: _signature(a.module, k) for k in r.kernels}
  running = [k for k in r.kernels if _runs(op, sig[k.name], k)
             and (where is None or _matches_kernel(k, where))]
  if not running:
    raise AssertionError(
        f"{r.module.name}: no kernel runs {op!r}, so nothing shows it fused into "
        f"{into!r} (kernels: {len(r.kernels)}; ops are JAX primitives, HLO opcodes or "
        f"one of {sorted(OP_SIGNATURES)})")
  apart = [k for k in running if not _runs(into, sig[k.name], k)]
  gaps = [g for g in select(r, (FindingKind.UNFUSED_EPILOGUE, FindingKind.UNFUSED_PROLOGUE),
                            where=where)
          if any(op in item for item in g.ops)]
  if not apart and not gaps:
    return r
  readers = _inputs_from(r, apart, lambda k: _runs(into, sig[k.name], k))
  lines = [f"{r.module.name}: {op!r} runs outside the {into!r} kernel in "
           f"{len(apart)} kernel(s):"]
  for k in apart:
    src = readers.get(k.name)
    feed = f", reading {src[0]} written by {src[1]}" if src else ""
    lines.append(f"  {k.kind.value} {layout.elide(k.name, 40)}{feed}  "
                 f"{fmt_source(k.source) or '?'}")
  if gaps:
    lines += _group_lines(r, gaps, title="findings:")
  raise AssertionError("\n".join(lines))


# ----------------------------------------------------------- helpers ----


def _group_lines(report: AuditReport, groups, title: str | None = None) -> list[str]:
  """The groups as the terminal report lists them: the estimated time saved
  (and its share of the step) beside the bytes, where the audit has one."""
  from hlo_audit._src.report.terminal import group_lines

  step = report.timing.step_time if report.timing is not None else None
  return group_lines(groups, MESSAGE_WIDTH, title=title, step=step)


def _message(report: AuditReport, head: str, groups) -> str:
  lines = [f"{report.module.name}: {head}"]
  if groups:
    lines += _group_lines(report, groups)
    lines.append("  (hlo_audit.audit(fn, *args).to_text(all=True) shows each decision record)")
  return "\n".join(lines)


def _iter(x) -> Iterable:
  return (x,) if isinstance(x, (str, FindingKind)) else x


def _kind(k) -> FindingKind:
  return k if isinstance(k, FindingKind) else finding_kind(k)


def _matches(f: FusionDecisionRecord, where) -> bool:
  if where is None:
    return True
  if callable(where):
    return bool(where(f))
  if f.source is None:
    return False
  return where in fmt_source(f.source) or where in f"{f.source.file}:{f.source.line}"


def _matches_kernel(k: Kernel, where) -> bool:
  if callable(where):
    return True  # predicates take records; kernels are not filtered by them
  if k.source is None:
    return False
  return where in fmt_source(k.source) or where in f"{k.source.file}:{k.source.line}"


def _signature(module: HloModule | None, k: Kernel) -> frozenset[str]:
  """Opcodes and JAX primitive names of everything a kernel runs."""
  names = set(k.fused_ops) | {k.opcode}
  if k.op_name:
    names.add(k.op_name.rsplit("/", 1)[-1])
  if module is None:
    return frozenset(names)
  try:
    comp = module.computation(k.computation)
  except KeyError:
    return frozenset(names)
  todo = [m for m in (k.name, *k.members) if m in comp]
  seen_comps: set[str] = set()
  stack = [comp.instruction(m) for m in todo]
  while stack:
    inst = stack.pop()
    names.add(inst.opcode)
    if inst.metadata.op_name:
      names.add(inst.metadata.op_name.rsplit("/", 1)[-1])
    for callee in inst.called_computation_names():
      if callee in seen_comps:
        continue
      seen_comps.add(callee)
      try:
        stack.extend(module.computation(callee).instructions)
      except KeyError:
        continue
  return frozenset(names)


def _runs(op: str, signature: frozenset[str], k: Kernel) -> bool:
  if op in signature:
    return True
  if any(s <= signature for s in OP_SIGNATURES.get(op, ())):
    return True
  words = _DETAIL_WORDS.get(op, ())
  detail = k.detail.lower()
  return any(w.lower() in detail for w in words) or (
      op in ("dot", "matmul") and k.kind in (KernelKind.TRITON_GEMM,))


def _inputs_from(report: AuditReport, kernels, is_source) -> dict[str, tuple[str, str]]:
  """For each kernel, one buffer it reads that a kernel matching
  `is_source` wrote: (buffer "name shape", writer)."""
  by_name = {k.name: k for k in report.kernels}
  wanted = {k.name for k in kernels}
  out: dict[str, tuple[str, str]] = {}
  for b in report.buffers:
    p = by_name.get(b.producer)
    if p is None or not is_source(p):
      continue
    for c in b.consumers:
      if c in wanted and c not in out:
        out[c] = (f"{b.shape}", f"{p.kind.value} {p.name}")
  return out

