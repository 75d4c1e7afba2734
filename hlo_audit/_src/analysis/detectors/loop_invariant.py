"""Loop-invariant work: while-body kernels whose inputs never change.

Their inputs are carry elements the body passes through unchanged,
constants, or other such kernels' results: hoisted out of the loop, they
run once instead of once per trip.
"""

from __future__ import annotations

from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.detectors.common import kernel_desc, through_bitcasts
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Kernels in a while body whose inputs are the same on every iteration:
  carry elements the body passes through unchanged, constants, and other
  such kernels' results. Hoisting them runs them once instead of per trip."""
  out = []
  for body_name, loop in program.loop_of.items():
    if body_name not in program.comps:
      continue
    body = program.comps[body_name]
    if not body.parameters:
      continue
    param = body.parameters[0].name
    root = body.root
    passed: set[int] = set()
    if root.opcode == "tuple":
      for i, name in enumerate(root.operands):
        src = through_bitcasts(body, name)
        if src is not None and src.opcode == "get-tuple-element" and \
            src.operands == (param,) and src.tuple_index == i:
          passed.add(i)
    invariant: set[str] = set()
    for i in body.instructions:
      if i.opcode == "get-tuple-element" and i.operands == (param,):
        if i.tuple_index in passed:
          invariant.add(i.name)
      elif i.opcode == "constant" or (
          i.operands and i.opcode not in ("parameter", "rng", "rng-bit-generator",
                                          "custom-call", "infeed", "outfeed",
                                          "send", "recv", "while", "conditional",
                                          "call", "tuple")
          and not i.opcode.endswith(("-start", "-done"))
          and all(o in invariant for o in i.operands)):
        invariant.add(i.name)
    for name in (i.name for i in body.instructions):
      k = program.kernels.get(name)
      if k is None or name not in invariant or k.kind is KernelKind.PALLAS:
        continue
      inst = program.inst(k)
      if inst.opcode in ("broadcast", "iota") or not any(
          program.comps[body_name].instruction(o).opcode != "constant" for o in inst.operands):
        continue  # constants materialized per trip: a memset, left to XLA
      trip = k.trip_count
      if trip is not None and trip <= 1:
        continue
      repeats = (trip - 1) if trip is not None else 1
      moved = k.bytes_read + k.bytes_written
      shape = inst.shape.dtype_str if inst.shape is not None else ""
      out.append(FusionDecisionRecord(
          kind=FindingKind.LOOP_INVARIANT, producer=k.name,
          consumers=tuple(c for b in program.writes.get(k.name, ()) for c in b.consumers),
          boundary=k.name, boundary_shape=shape,
          bytes_saved=moved * repeats, launches_removed=repeats,
          extra_arithmetic="none: computed once before the loop",
          extra_resources=f"the result ({shape}) stays live across the loop",
          numerical_class=NumericalClass.EXACT,
          guard="n/a: a change to the program (hoist), not a kernel",
          layout_effect="none",
          evidence=(f"{kernel_desc(k)} in the body of while loop {loop} reads only "
                    f"values that do not change across iterations, and runs "
                    f"{trip if trip is not None else 'an unknown number of'} times "
                    f"moving {moved} bytes each time"),
          verdict=Verdict.SAFE,
          reasons=("hoist: compute it once before the loop (outside the scanned "
                   "function, or saved by the remat policy) and pass it in",),
          risks=("peak: the hoisted result is live for the whole loop",
                 "under jax.checkpoint/remat the recompute may be deliberate: "
                 "check the policy"),
          ops=("hoist",), kernel=None, trip_count=trip, source=k.source,
          computation=k.computation))
  return tuple(out)
