"""Expanded broadcasts: a small value written to memory at full size.

A kernel whose output is a broadcast of a scalar or vector (the buffer
analysis's expansion ratio) writes every copy; its readers could broadcast
the compact value on load instead.
"""

from __future__ import annotations

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.buffers import Buffer, Lifetime, expanded_broadcast_ratio
from hlo_audit._src.analysis.detectors.common import (COMMON_RISKS, consumer_kernels,
                                                      kernel_desc, operand_number, times)
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Buffers that expand a smaller value, with the bytes the expansion costs."""
  out = []
  for buf in program.buffers.values():
    if buf.lifetime is not Lifetime.EXPANDED_BROADCAST or buf.internal:
      continue
    k = program.kernels.get(buf.producer)
    if k is None:
      continue
    inst = program.inst(k)
    ratio = expanded_broadcast_ratio(program.module, inst, buf.index,
                                     program.comps[k.computation])
    compact = int(buf.bytes / ratio)
    consumers = consumer_kernels(program, buf)
    if consumers and all(_library_bias(program, c, buf) for c in consumers):
      continue
    out.append(FusionDecisionRecord(
        kind=FindingKind.EXPANDED_BROADCAST, producer=k.name,
        consumers=tuple(c.name for c in consumers), boundary=buf.name,
        boundary_shape=buf.shape,
        bytes_saved=times(2 * (buf.bytes - compact), k.trip_count),
        launches_removed=times(1, k.trip_count),
        extra_arithmetic="broadcast index math in each consumer's loads",
        extra_resources=f"the compact value ({compact} bytes) per tile",
        numerical_class=NumericalClass.EXACT,
        guard="none needed: consumers broadcast on load",
        layout_effect="none: consumers read the compact value",
        evidence=(f"{kernel_desc(k)} writes {buf.shape} ({buf.bytes} bytes), an "
                  f"{ratio:.0f}x expansion of a {compact}-byte value, read by "
                  f"{', '.join(c.name for c in consumers) or 'nothing'}"),
        verdict=Verdict.SAFE, reasons=("broadcast scalars or vectors",),
        risks=("cache reuse: each consumer re-broadcasts",) + COMMON_RISKS,
        ops=("broadcast",), kernel=None, trip_count=k.trip_count, source=buf.source,
        computation=k.computation))
  return tuple(out)


#: cuDNN's fused convolution's operands: (input, filter, bias, side input).
_CONV_BIAS_OPERAND = 2


def _library_bias(program: Program, consumer, buf: Buffer) -> bool:
  """Whether `consumer` is cuDNN's fused convolution reading `buf` as its
  bias: the call takes a dense [C] vector and broadcasts nothing on load
  (XLA passes zeros there when it wants the call for its result scale)."""
  inst = program.inst(consumer)
  return (inst.opcode == "custom-call" and
          inst.custom_call_target == bt.CONV_BIAS_ACTIVATION_TARGET and
          operand_number(program, consumer, buf) == _CONV_BIAS_OPERAND)
