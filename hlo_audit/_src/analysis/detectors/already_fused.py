"""Already fused: the elementwise work XLA or a library applies after a matmul.

Not a gap: the record says what was fused (an XLA fusion's work after its
dot, a cuBLASLt or cuDNN call's epilogue, a split-K sum with its epilogue),
so the report shows what XLA got right beside what it left.
"""

from __future__ import annotations

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.buffers import fused_root
from hlo_audit._src.analysis.detectors.common import (anchor_of, kernel_desc, primitive,
                                                      split_k_site)
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, Instruction


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """A record for each matmul kernel that already applies elementwise work
  after its anchor (XLA's fusion, a library call's epilogue)."""
  out = []
  for k in program.kernels.values():
    anchor = anchor_of(program, k)
    if anchor is None:
      continue
    work = _anchor_fused_epilogue(program, k)
    if work:
      out.append(_record(program, k, anchor, work))
  return tuple(out)


def _record(program: Program, k: Kernel, anchor: str,
            work: tuple[str, ...]) -> FusionDecisionRecord:
  """The record of `k`, whose `anchor` applies `work` already."""
  inst = program.inst(k)
  epilogue = bt.gemm_epilogue(inst)
  if epilogue:
    evidence = f"{inst.custom_call_target} with epilogue={epilogue} fuses {', '.join(work)}"
  elif bt.conv_epilogue(inst):
    evidence = (f"{inst.custom_call_target} (cuDNN's fused convolution) computes the "
                f"convolution and {', '.join(work)} in one call")
  elif split_k_site(program, k) is not None:
    evidence = (f"{kernel_desc(k)} sums the gemm's split-K partial sums and applies "
                f"{', '.join(work)} in one kernel")
  else:
    evidence = f"{kernel_desc(k)} computes the {anchor} and {', '.join(work)} in one kernel"
  shape = inst.shape.dtype_str if inst.shape is not None else ""
  return FusionDecisionRecord(
      kind=FindingKind.ALREADY_FUSED, producer=k.name, consumers=(),
      boundary="", boundary_shape=shape, bytes_saved=0, launches_removed=0,
      extra_arithmetic="none", extra_resources="none",
      numerical_class=NumericalClass.SAME_OPS, guard="n/a",
      layout_effect="none", evidence=evidence, verdict=Verdict.KEEP,
      reasons=("XLA already fused this epilogue",), risks=(), ops=work,
      kernel=None, trip_count=k.trip_count, source=k.source, computation=k.computation)


def _anchor_fused_epilogue(program: Program, k: Kernel) -> tuple[str, ...]:
  """Elementwise work XLA already fused after the anchor inside the kernel."""
  inst = program.inst(k)
  epilogue = bt.gemm_epilogue(inst) if inst.opcode == "custom-call" else None
  if epilogue:
    return bt.GEMM_EPILOGUES.get(epilogue, (epilogue.lower(),))
  conv = bt.conv_epilogue(inst)
  if conv:
    return conv
  if inst.opcode != "fusion":
    return ()
  found = fused_root(program.module, inst)
  if found is None:
    return ()
  comp, root = found
  if root.opcode in ("dot", "convolution", "bitcast", "copy", "tuple"):
    return ()
  # Every split-K sum is the gemm's (a kernel may sum several gemms' partials).
  stop = {i.name for i in comp.instructions if bt.is_split_k_reduce(i)}
  if root.name in stop:
    return ()
  # The work, not the data movement around it (broadcast constants, bitcasts).
  return tuple(sorted({primitive(i) for i in _path_to_anchor(comp, root, stop)
                       if i.opcode not in opcodes.DATA_MOVEMENT} - {""}))


def _path_to_anchor(comp: Computation, root: Instruction,
                    stop: set[str] | frozenset[str] = frozenset()) -> list[Instruction]:
  """The instructions from `root` back to the anchor (a dot, a convolution,
  or the reduces in `stop`: a split-K sum)."""
  out = []
  stack = [root]
  seen = set()
  while stack:
    i = stack.pop()
    if i.name in seen or i.name in stop or i.opcode in (
        "dot", "convolution", "parameter", "constant"):
      continue
    seen.add(i.name)
    out.append(i)
    stack.extend(comp.instruction(o) for o in i.operands)
  return out
