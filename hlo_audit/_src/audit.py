"""The audit pipeline: capture -> parse -> analyse -> report.

`audit(jax.jit(f), *args)` compiles and audits a function; `audit_hlo(...)`
audits HLO text, a file or an XLA dump folder; `audit_capture(capture)` runs
the analyses on a capture already made.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from hlo_audit._src.analysis import collectives, custom_calls, detectors, memory_findings
from hlo_audit._src.analysis import time_model, xla_estimate
from hlo_audit._src.analysis import source as source_mod
from hlo_audit._src.analysis.buffer_sharing import infer_platform
from hlo_audit._src.analysis.buffers import find_buffers
from hlo_audit._src.analysis.dataflow import analyze_dataflow
from hlo_audit._src.analysis.kernel_library import installed_libraries
from hlo_audit._src.analysis.kernels import find_kernels
from hlo_audit._src.analysis.layers import with_layers
from hlo_audit._src.analysis.liveness import analyze_liveness
from hlo_audit._src.analysis.options import AuditOptions
from hlo_audit._src.analysis.program import Program, arguments_of
from hlo_audit._src.analysis.records import FusionDecisionRecord
from hlo_audit._src.analysis.replay import exact_peaks
from hlo_audit._src.analysis.schedule import flatten_schedule
from hlo_audit._src.analysis.source import release_tables
from hlo_audit._src.capture.capture import Capture, capture_text, start_capture
from hlo_audit._src.capture.dump import load_dump
from hlo_audit._src.errors import HloAuditError, TargetError
from hlo_audit._src.gc_pause import paused_gc
from hlo_audit._src.hlo.ir import HloModule
from hlo_audit._src.report.report import AuditReport, ModuleInfo
from hlo_audit._src.target.devices import DeviceFacts
from hlo_audit._src.target.target import Target, device_facts, facts_for_device_kind

#: Our peak and XLA's are expected to agree this closely.
PEAK_TOLERANCE = 0.01

#: What the audit looks for, in report order: the fusion boundaries XLA
#: left (one detector per class), then memory (donation, remat), then
#: collectives. Each finder takes the program and returns its records, each
#: with the peak after its change where it has one.
FINDERS = (detectors.find, memory_findings.find, collectives.find)


def audit(fn: Any, *args: Any, xla_reports: bool = False,
          target: str | os.PathLike | Target | None = None,
          **kwargs: Any) -> AuditReport:
  """Compiles `fn` for `args` (as `capture` does) and audits the result.

  No second compile: when jit already compiled `fn` for these argument types
  the audit reuses that executable (and its buffer assignment, for XLA's
  peak); otherwise it builds the one jit will run. With `target`, the
  program is XLA's for that device, compiled on this machine (e.g.
  `audit(step, params, batch, target="h200")` without a GPU).

  Args:
    fn: a `jax.jit` function, a plain callable, a `Lowered`, a `Compiled`, or
      a `Capture` (then no arguments).
    *args: arrays, `jax.ShapeDtypeStruct`s or pytrees of them.
    xla_reports: also read XLA's dump reports (its live ranges), which costs
      one more compile (see `capture`).
    target: the device to compile for: a name ("h200", "h100", "b200", ...:
      `hlo_audit.list_targets()`), a `GpuTargetConfigProto` text file, or a
      `hlo_audit.Target` (`get_target("h200", gpus=8)`). None: this
      machine's default backend.
    **kwargs: keyword arguments of `fn`.

  Returns:
    The audit report.

  Raises:
    CaptureError: if `fn` cannot be traced or compiled with these arguments.
    TargetError: for an unknown target or missing plugin wheels.
  """
  if isinstance(fn, Capture):
    if args or kwargs or xla_reports or target is not None:
      raise HloAuditError("audit(capture) takes no further arguments")
    return audit_capture(fn)
  pending = start_capture(fn, *args, xla_reports=xla_reports, target=target, **kwargs)
  with paused_gc():
    return _audit_capture(pending.partial, AuditOptions(), pending.result)


def audit_hlo(source: str | os.PathLike | HloModule | Capture, *,
              module: str | None = None,
              options: AuditOptions | None = None) -> AuditReport:
  """Audits HLO text, an HLO text file, an XLA dump folder, or a parsed module.

  Args:
    source: HLO text; a path to an HLO text file or to a dump folder written by
      `XLA_FLAGS=--xla_dump_to=DIR`; an `HloModule`; or a `Capture`.
    module: for dump folders, a regex picking the module (default: the
      largest optimized module).
    options: audit thresholds.

  Raises:
    HloParseError: for malformed HLO.
    DumpError: for an empty or foreign folder, or a `module` matching none.
  """
  if isinstance(source, Capture):
    return audit_capture(source, options)
  if isinstance(source, HloModule):
    cap = Capture(module=source, hlo_text=source.text or "", origin="text",
                  path=source.source,
                  notes=("HLO module alone: no XLA buffer assignment",))
    return audit_capture(cap, options)
  if isinstance(source, os.PathLike) or (
      isinstance(source, str) and "\n" not in source and
      not source.lstrip().startswith(("HloModule", "ENTRY", "%"))):
    path = os.fspath(source)
    return audit_capture(load_dump(path, module).capture(module), options)
  return audit_capture(capture_text(source), options)


def audit_capture(cap: Capture, options: AuditOptions | None = None) -> AuditReport:
  """Runs the analyses on a capture and builds the report."""
  with paused_gc():  # the analyses build large acyclic tables
    return _audit_capture(cap, options or AuditOptions())


def _audit_capture(cap: Capture, options: AuditOptions,
                   complete: Callable[[], Capture] | None = None) -> AuditReport:
  """The audit of `cap`; with `complete`, `cap` lacks XLA's analyses of the
  executable (still running beside the analyses here), and `complete()`
  gives the whole capture once they are needed."""
  module = cap.module
  schedule = flatten_schedule(module)
  dataflow = analyze_dataflow(module, schedule)
  cache: dict = {}  # tables the what-if replays share with this run
  # Whose buffer-sharing rules apply: the capture's backend, else the HLO's marks.
  platform = cap.platform or infer_platform(module)
  # The device prices the kernels and tells libraries which calls it runs;
  # a TPU generation sizes XLA:TPU's tuple tables.
  facts, device_note = device_facts_for(cap, options, platform)
  liveness = analyze_liveness(module, schedule, dataflow, cache=cache, platform=platform,
                              device=facts.name if facts is not None else "",
                              libtpu=cap.libtpu_version)
  libraries = installed_libraries(options.kernel_libraries)
  # A kernel library's internals are not the user's code either.
  paths = {"library_paths": options.library_paths + tuple(
               source_mod.library_source_path(lib.name) for lib in libraries.libraries),
           "user_paths": options.user_paths}
  kernels = find_kernels(module, schedule, dataflow, scopes=libraries.scopes, **paths)
  buffers = find_buffers(module, schedule, dataflow, liveness, kernels, **paths)
  program = Program(module=module, schedule=schedule, dataflow=dataflow,
                    liveness=liveness, kernels={k.name: k for k in kernels},
                    buffers={b.name: b for b in buffers},
                    arguments=arguments_of(module, cap.argument_names),
                    platform=platform, options=options, libraries=libraries,
                    device=facts, libtpu_version=cap.libtpu_version,
                    pre_optimization=lambda: cap.pre_optimization_text, cache=cache)
  optimized = is_optimized(module)
  # The findings judge XLA's decisions: a module XLA has not optimized holds
  # none yet (every op would read as a boundary left unfused).
  found = [f for find in FINDERS for f in find(program)] if optimized else []
  # Full replays for the estimated peaks that can move, the largest first,
  # within one budget for the whole audit (donation took its share first).
  found = exact_peaks(program, found, min_peak_saved=options.min_bytes_saved)
  findings = with_layers(_one_per_boundary([f for f in found if f is not None]), program)
  release_tables(module)  # every finding has its source by now
  program_collectives = collectives.find_collectives(program)
  step = None
  if facts is not None:
    step = time_model.estimate(program, facts)
    findings = time_model.price_findings(findings, step)
  program.tables.clear()  # the report keeps the program, not the finders' tables
  if complete is not None:
    cap = complete()  # XLA's peak and cost: now wait for its analyses
  xla_peak = _xla_peak(cap)
  backend_step = spread = None
  if (cap.platform or "").lower() == "tpu":
    backend_step = xla_estimate.libtpu_step(cap.cost_analysis, module)
    if step is not None:
      spread = xla_estimate.cycles_spread(
          xla_estimate.estimated_cycles(module),
          {k.name: k.time_per_launch for k in step.kernels})
  notes = list(cap.notes) + list(libraries.notes)
  if not optimized:
    notes.insert(0, NOT_OPTIMIZED)
  elif not module.is_scheduled:
    notes.append("the module is not scheduled: text order stands in for XLA's schedule")
  if device_note:
    notes.append(device_note)
  unknown = custom_calls.unknown_targets(module)
  if unknown:
    notes.append("unknown custom-call targets (opaque: their reads and writes count, "
                 f"what they compute is not audited): {', '.join(map(repr, unknown))}")
  if xla_peak:
    gap = (liveness.peak_bytes - xla_peak) / xla_peak
    if abs(gap) > PEAK_TOLERANCE:
      notes.append(f"our peak differs from XLA's by {100 * gap:+.1f}% "
                   "(more than 1%): XLA's heap packing or sharing decisions differ "
                   "from this model for this module")
  info = ModuleInfo(
      name=module.name, platform=cap.platform, device_kind=cap.device_kind,
      jax_version=cap.jax_version, jaxlib_version=cap.jaxlib_version,
      instruction_count=module.instruction_count,
      computation_count=len(module.computations),
      schedule_length=schedule.end, is_scheduled=module.is_scheduled,
      optimized=optimized,
      origin=cap.origin, path=cap.path, xla_peak_source=_xla_peak_source(cap),
      target=cap.target.label if cap.target is not None else "",
      target_notes=cap.target.notes() if cap.target is not None else ())
  names = {b: b[0] + ("{" + ",".join(map(str, b[1])) + "}" if b[1] else "")
           for b in liveness.live_at_peak}
  return AuditReport(
      module=info, kernels=kernels, buffers=buffers, findings=findings,
      peak_bytes=liveness.peak_bytes, xla_peak_bytes=xla_peak,
      xla_reported_peak_bytes=(cap.memory_stats.peak_bytes
                               if cap.memory_stats is not None else None),
      allocation_bytes=liveness.allocation_bytes,
      heap_peak_bytes=liveness.peak_heap_bytes, peak_time=liveness.peak_time,
      timeline=liveness.timeline,
      live_at_peak=tuple(names[b] for b in liveness.live_at_peak),
      cost_analysis=cap.cost_analysis, notes=tuple(notes), options=options,
      collectives=program_collectives, program=program,
      kernel_libraries=tuple(lib.name for lib in libraries.swapping), timing=step,
      xla_estimate=backend_step, cycles_spread=spread)


def device_facts_for(cap: Capture, options: AuditOptions,
                     platform: str = "") -> tuple[DeviceFacts | None, str]:
  """The facts that price the capture's kernels, and a note for the report
  ("" when none): why there are none, or whose they are. The options'
  device, else the target compiled for, else the device jax compiled on
  (this machine's CPU is calibrated once)."""
  if options.device is not None:  # asked for: an unknown name is an error
    return device_facts(options.device), ""
  try:
    if cap.target is not None:
      return device_facts(cap.target), ""
    facts = facts_for_device_kind(cap.platform or platform, cap.device_kind)
  except TargetError as e:
    return None, f"time not estimated: {e}"
  if facts is None:
    return None, ("time not estimated: the device is unknown (name it: "
                  "AuditOptions(device='h200'), or --device h200)")
  if not cap.platform and facts.platform == "cpu":
    return facts, "time priced on this machine's CPU (HLO text names no device)"
  return facts, ""


#: What the report says of a module XLA has not optimized.
NOT_OPTIMIZED = (
    "this module is not optimized: XLA has not fused or scheduled it (e.g. a "
    "dump's *.before_optimizations.txt), so it shows no fusion decisions and "
    "no findings are reported. Audit the optimized module instead: "
    "hlo_audit.audit(jax.jit(f), *args), the text of "
    "jax.jit(f).lower(*args).compile().as_text(), or the dump's "
    "*.after_optimizations.txt (XLA_FLAGS=--xla_dump_to=DIR)")


def is_optimized(module: HloModule) -> bool:
  """Whether XLA's optimization passes produced `module`: it is scheduled,
  or it holds what only they write (optimized HLO printed without its
  schedule): fusions, bitcasts (JAX lowers reshapes as reshapes), or a dot
  or convolution rewritten into a library call (cuBLAS, cuDNN, oneDNN)."""
  if module.is_scheduled:
    return True
  for c in module.computations:
    for i in c.instructions:
      if i.opcode in ("fusion", "bitcast"):
        return True
      if i.opcode == "custom-call" and \
          custom_calls.classify(i).family in custom_calls.REWRITTEN_BY_XLA:
        return True
  return False


def _one_per_boundary(findings: list[FusionDecisionRecord]) -> tuple:
  """`findings`, one record per boundary: a later finder's record on a
  boundary an earlier record names becomes a note on it (the first record's
  verdict stands; its peak is filled from the later one when it had none).
  The detectors' records are one per boundary already."""
  out: list[FusionDecisionRecord] = []
  at: dict[tuple[str, str], int] = {}
  for f in findings:
    i = at.get((f.computation, f.boundary)) if f.boundary else None
    if i is None:
      if f.boundary:
        at[(f.computation, f.boundary)] = len(out)
      out.append(f)
      continue
    note = f"also {f.kind.value}: {f.evidence}" + (f"; {f.suggestion}" if f.suggestion else "")
    first = out[i]
    out[i] = dataclasses.replace(
        first, notes=(*first.notes, note),
        peak_after=first.peak_after if first.peak_after is not None else f.peak_after,
        peak_saved=first.peak_saved if first.peak_after is not None else f.peak_saved,
        peak_exact=first.peak_exact if first.peak_after is not None else f.peak_exact)
  return tuple(out)


def _xla_peak(cap: Capture) -> int | None:
  """XLA's total: its allocations plus its temp buffer (thread-local scratch
  excluded), from the buffer assignment when dumped, else memory_analysis."""
  if cap.xla_allocated_bytes is not None:
    return cap.xla_allocated_bytes
  m = cap.memory_stats
  if m is not None:
    return m.argument_bytes + m.output_bytes + m.temp_bytes - m.alias_bytes
  return None


def _xla_peak_source(cap: Capture) -> str:
  """Which of XLA's reports `_xla_peak` read."""
  if cap.xla_allocated_bytes is not None:
    return cap.xla_memory_source or "buffer assignment"
  return "memory_analysis" if cap.memory_stats is not None else ""
