"""Keep-reuse: a large buffer several kernels read, where materializing it is right.

Not a gap: fusing its producer into each reader would repeat the producer's
loads and work once per reader. Only buffers worth a share of the peak
(`AuditOptions.keep_fraction`) with enough readers are recorded.
"""

from __future__ import annotations

from hlo_audit._src.analysis.buffers import Lifetime
from hlo_audit._src.analysis.detectors.common import kernel_desc
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Large buffers read by several kernels, written once on purpose."""
  out = []
  threshold = program.options.keep_fraction * program.liveness.peak_bytes
  for buf in program.buffers.values():
    if buf.internal or not buf.producer or buf.bytes < threshold:
      continue
    if buf.lifetime in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT):
      continue
    if len(buf.consumers) < program.options.keep_min_consumers:
      continue
    if buf.aliases and buf.lifetime is not Lifetime.INPUT:
      # Written in place (scatter, dynamic-update-slice): its readers read
      # the updated values, not what the producer wrote.
      continue
    k = program.kernels.get(buf.producer)
    if k is None:
      continue
    out.append(FusionDecisionRecord(
        kind=FindingKind.KEEP_REUSE, producer=k.name, consumers=buf.consumers,
        boundary=buf.name, boundary_shape=buf.shape, bytes_saved=0,
        launches_removed=0,
        extra_arithmetic=(f"fusing would recompute {k.name} in "
                          f"{len(buf.consumers)} consumers"),
        extra_resources="n/a", numerical_class=NumericalClass.EXACT, guard="n/a",
        layout_effect="none",
        evidence=(f"{buf.shape} written by {kernel_desc(k)} is read by "
                  f"{len(buf.consumers)} kernels: {', '.join(buf.consumers)}"),
        verdict=Verdict.KEEP,
        reasons=("reuse exists: several consumers exploit the materialization",),
        risks=("cache reuse: fusing the producer duplicates its loads and work",),
        ops=(f"{len(buf.consumers)} readers",), kernel=None, trip_count=k.trip_count,
        source=buf.source, computation=k.computation))
  return tuple(out)
