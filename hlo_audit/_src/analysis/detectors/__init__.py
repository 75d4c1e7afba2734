"""Detectors: find the boundaries XLA left, as fusion decision records.

One module per finding class; each `find(program)` reads the program and
returns records (no printing, no state). `find` runs them in `DETECTORS`
order, keeps one record per boundary (`merge.py`), asks the kernel
libraries which op closes each, and gives every record its suggested call
and the peak after its change.

What the epilogue and prologue detectors recognise is read from the fused
computations: the JAX primitive names XLA keeps in `op_name` metadata (add,
mul, erf, tanh, logistic, convert_element_type, ...) where present, the
opcodes otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from hlo_audit._src.analysis.detectors import (already_fused, broadcasts, copies, cross_entropy,
                                               epilogues,
                                               in_place, keep_reuse, loop_invariant,
                                               prologues, reductions, slices)
from hlo_audit._src.analysis.detectors.merge import (epilogue_or_prologue, one_per_boundary,
                                                     split_or_relayouts)
from hlo_audit._src.analysis.kernel_library import with_kernels
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, Verdict
from hlo_audit._src.analysis.replay import peak_after_fusions, with_peaks
from hlo_audit._src.analysis.suggestions import add_suggestions

#: The detectors, one per finding class, in the order their records are
#: merged (a tie between two records of one boundary goes to the first).
DETECTORS = (copies.find, broadcasts.find, epilogues.find, already_fused.find,
             prologues.find, reductions.find, slices.find, loop_invariant.find,
             keep_reuse.find, in_place.find)


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Every detector's findings (`decisions`), each with its kernel
  library's suggested call, its source stack and the peak after its change
  alone (the quick replay where that can move the peak)."""
  findings = decisions(program)
  stacks = _source_stacks(findings, program)
  findings = add_suggestions(findings, program.module, program.libraries, program.device)
  peak = program.liveness.peak_bytes
  fusions = [(f.boundary, f.producer, f.consumers)
             if f.boundary and f.verdict is not Verdict.KEEP and not f.boundary_kept
             else None for f in findings]
  peaks = peak_after_fusions(program, fusions)
  # A fusion that keeps its boundary (another reader needs it) leaves the
  # peak as it is.
  peaks = [(peak, True) if f.boundary_kept else p for f, p in zip(findings, peaks)]
  return tuple(with_peaks(findings, peaks, peak, stacks))


def decisions(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """All findings, one per boundary, largest saving first within each
  class; each finding a kernel could close names the libraries' op for its
  `need`."""
  found = [r for detect in DETECTORS for r in detect(program) if _in_device_memory(program, r)]
  found = cross_entropy.retarget(program, split_or_relayouts(epilogue_or_prologue(found)))
  found = one_per_boundary(with_kernels(found, program.libraries))
  order = list(FindingKind)
  found = [r for r in found if r.bytes_saved >= program.options.min_bytes_saved or
           r.kind in (FindingKind.KEEP_REUSE, FindingKind.ALREADY_FUSED)]
  found.sort(key=lambda r: (order.index(r.kind), -r.bytes_saved, r.boundary))
  return tuple(found)


def _source_stacks(findings: Sequence[FusionDecisionRecord],
                   program: Program) -> list[tuple]:
  """Each finding's stack: that of the buffer or kernel it names whose
  `source` it took (detectors copy `source` only)."""
  stacks = {}
  for row in (*program.kernels.values(), *program.buffers.values()):
    if row.source is not None:
      stacks.setdefault((row.name, row.source), row.source_stack)
  return [next((stacks[(n, f.source)] for n in (f.boundary, f.producer, *f.consumers)
                if (n, f.source) in stacks), (f.source,) if f.source else ())
          for f in findings]


def _in_device_memory(program: Program, r: FusionDecisionRecord) -> bool:
  """Whether the record's boundary lies in device memory: a buffer XLA:TPU
  keeps in VMEM (`S(1)`) between two kernels is never written to HBM, so no
  fusion saves its traffic there."""
  buf = program.buffers.get(r.boundary) if r.boundary else None
  if buf is None or buf.computation not in program.comps:
    return True
  comp = program.comps[buf.computation]
  if buf.instruction not in comp:
    return True
  shape = comp.instruction(buf.instruction).shape
  try:
    leaf = shape.subshape(buf.index)
  except (IndexError, AttributeError):
    return True
  return leaf.memory_space == 0
