"""Materialized slices: cut or joined data written for readers that could index it.

A slice, dynamic-slice or concatenate written to memory for one reader, or
for several elementwise readers, that could read the parts where they are
(a slice a matmul reads is an unfused prologue).
"""

from __future__ import annotations

from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import Lifetime
from hlo_audit._src.analysis.detectors.common import (COMMON_RISKS, SLICE_GLUE, SLICE_OPS,
                                                      anchor_of, consumer_kernels,
                                                      kernel_desc, scalar_ops, times)
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             KernelNeed, NumericalClass, Verdict)


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """A slice, dynamic-slice or concatenate written to memory for one
  reader, or for several elementwise readers, that could read the parts in
  place (matmuls reading a slice are unfused prologues)."""
  out = []
  for k in program.kernels.values():
    if k.kind is KernelKind.PALLAS:
      continue
    inst = program.inst(k)
    ops = set(k.fused_ops) if inst.opcode == "fusion" else {inst.opcode}
    cut = ops & SLICE_OPS
    if not cut or not ops <= SLICE_OPS | SLICE_GLUE | scalar_ops(program, k):
      continue
    for buf in program.writes.get(k.name, ()):
      if buf.internal or buf.lifetime is Lifetime.EXTERNAL_OUTPUT:
        continue
      consumers = consumer_kernels(program, buf)
      if not consumers:
        continue
      if len(consumers) > 1 and not all(
          c.kind in (KernelKind.LOOP_FUSION, KernelKind.INPUT_FUSION) for c in consumers):
        continue  # several readers of which some cannot index in place
      reader = consumers[0]
      anchor = anchor_of(program, reader)
      if anchor and "concatenate" not in cut:
        continue  # a slice read by a matmul: an unfused prologue
      what = "concatenate" if "concatenate" in cut else (
          "dynamic-slice" if "dynamic-slice" in cut else "slice")
      library = reader.kind in (KernelKind.CPU_LIBRARY_FUSION, KernelKind.LIBRARY_CALL,
                                KernelKind.CUSTOM_FUSION, KernelKind.TRITON_GEMM)
      out.append(FusionDecisionRecord(
          kind=FindingKind.MATERIALIZED_SLICE, producer=k.name,
          consumers=tuple(c.name for c in consumers), boundary=buf.name,
          boundary_shape=buf.shape,
          bytes_saved=times(2 * buf.bytes, k.trip_count),
          launches_removed=times(1, k.trip_count),
          extra_arithmetic=("offset arithmetic in the reader's loads" if what != "concatenate"
                            else "a select between the parts in the reader's loads"),
          extra_resources="none expected", numerical_class=NumericalClass.EXACT,
          guard=("no kernel yet: no kernel reads the parts in place"
                 if anchor else "none needed: the reader indexes the parts"),
          layout_effect="none: the reader reads the source buffer(s)",
          evidence=(f"{kernel_desc(k)} writes a {what} {buf.shape} that only "
                    + ", ".join(kernel_desc(c) for c in consumers)
                    + (" read" if len(consumers) > 1 else " reads")
                    + (f" ({anchor})" if anchor else "")
                    + (f", {k.trip_count} times per run" if (k.trip_count or 1) > 1 else "")),
          verdict=Verdict.RISKY if library else Verdict.SAFE,
          reasons=((f"the reader is a library {anchor or 'call'} that takes a "
                    "contiguous operand: reading in place needs a kernel that "
                    "takes an offset",) if library else
                   ("same-index elements at an offset: the reader can load them "
                    "in place",)),
          risks=("memory coalescing: strided reads of a column slice",) + COMMON_RISKS,
          ops=(what,), kernel=None, trip_count=k.trip_count, source=buf.source,
          computation=k.computation,
          need=(KernelNeed(FindingKind.MATERIALIZED_SLICE, anchor, (what,),
                           reads_parts=True) if anchor else None)))
  return tuple(out)
