"""Lost in-place updates: a donated buffer rewritten whole every run.

A KV cache, a ring buffer or an optimizer's slot is donated so that XLA can
update it in place: `cache.at[:, pos].set(new)` (a dynamic-update-slice)
then writes one slot, and the step's traffic on the buffer is that slot.
Where the layout XLA keeps the buffer in differs from the one its readers
want (an attention dot reading the cache transposed), or a conversion sits
between the parameter and the update, XLA copies or transposes the whole
buffer, updates the copy and writes it back whole: O(buffer) traffic per
run instead of O(slot). The copies themselves show up as standalone copies;
this finding says what they add up to, that the donation's point is lost,
and what would restore it (store the buffer in the layout its readers use,
or keep its dtype).

The rule, read off the optimized HLO: a parameter aliased to an output
(`input_output_alias`) whose writer holds a dynamic-update-slice or scatter
into the parameter's values (its destination traced through conversions,
copies and transposes to the parameter or a whole copy of it), but does not
update the parameter's own buffer (the destination is not the parameter
itself, through bitcasts). A scatter into another buffer (a gradient's
scatter-add into zeros) in the kernel that rewrites a table whole, as any
optimizer step does, is no lost update.
"""

from __future__ import annotations

from hlo_audit._src.analysis.detectors.common import (COMMON_RISKS, fused_computation,
                                                      kernel_desc, product, through_bitcasts,
                                                      times)
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program, buffer_name, parameter_paths
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)
from hlo_audit._src.hlo.ir import Computation, Instruction

#: Opcodes that update part of a buffer (in place when XLA can).
_UPDATES = ("dynamic-update-slice", "scatter")


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """A record per donated parameter whose in-place update XLA lost."""
  module, dataflow = program.module, program.dataflow
  aliases = module.input_output_alias
  if not aliases:
    return ()
  entry = module.entry
  params = {p.parameter_number: p for p in entry.parameters}
  outputs = dict(dataflow.holds.get(entry.root_name, ()))
  paths = parameter_paths(module)
  out = []
  for a in aliases:
    p = params.get(a.parameter)
    vid = outputs.get(tuple(a.output_index))
    if p is None or a.parameter_index or vid is None or p.shape is None:
      continue
    writer = program.kernels.get(vid[0])
    if writer is None or writer.computation != entry.name:
      continue
    updates = _update_sites(program, writer)
    if not updates or _updates_in_place(program, writer, p.name, updates):
      continue
    chain = _whole_buffer_kernels(program, p, writer)
    if not _updates_the_buffer(program, writer, updates, {p.name, *(k.name for k in chain)}):
      continue  # an update of something else (a gradient's scatter-add into zeros)
    update_bytes = sum(_update_shape(comp, u)[1] for comp, u in updates)
    moved = sum(k.bytes_moved for k in chain)
    saved = max(0, moved - 2 * update_bytes)
    if saved <= 0:
      continue
    update = ", ".join(dict.fromkeys(_update_shape(comp, u)[0] for comp, u in updates))
    out.append(_record(program, p, paths.get(a.parameter, p.name), writer, chain,
                       vid, update, saved))
  return tuple(out)


def _update_sites(program: Program, k: Kernel) -> list[tuple[Computation, Instruction]]:
  """The dynamic-update-slices and scatters `k` runs."""
  inst = program.inst(k)
  if inst.opcode in _UPDATES:
    return [(program.comps[k.computation], inst)]
  fused = fused_computation(program, k)
  if fused is None:
    return []
  return [(fused, i) for i in fused.instructions if i.opcode in _UPDATES]


#: Ops that carry a buffer's values to an update's destination unchanged
#: but for layout or precision.
_CARRIES = frozenset({"bitcast", "convert", "copy", "transpose", "reshape"})


def _destination(program: Program, writer: Kernel, comp: Computation, u: Instruction,
                 through: frozenset[str] | set[str]) -> str | None:
  """The entry instruction whose buffer update `u` writes into: its
  destination operand traced through the ops in `through`, then, inside a
  fusion, out to the fusion's operand (through bitcasts); None where it is
  made inside the kernel (a broadcast of zeros)."""
  if not u.operands or u.operands[0] not in comp:
    return None
  dest = comp.instruction(u.operands[0])
  while dest.opcode in through and dest.operands and dest.operands[0] in comp:
    dest = comp.instruction(dest.operands[0])
  entry = program.comps[writer.computation]
  if comp is entry:
    return dest.name
  operands = program.inst(writer).operands
  if dest.opcode != "parameter" or dest.parameter_number is None or \
      dest.parameter_number >= len(operands):
    return None
  src = through_bitcasts(entry, operands[dest.parameter_number])
  return src.name if src is not None else operands[dest.parameter_number]


def _updates_in_place(program: Program, writer: Kernel, param: str,
                      updates: list[tuple[Computation, Instruction]]) -> bool:
  """Whether one of `writer`'s updates writes into the parameter's own
  buffer: its destination is the parameter, through bitcasts only."""
  return any(_destination(program, writer, comp, u, {"bitcast"}) == param
             for comp, u in updates)


def _updates_the_buffer(program: Program, writer: Kernel,
                        updates: list[tuple[Computation, Instruction]],
                        sources: set[str]) -> bool:
  """Whether an update's destination is the donated buffer's values: traced
  (through bitcasts, conversions, copies, transposes) to the parameter or a
  whole copy of it among `sources`, not some other buffer the writer fills."""
  return any(_destination(program, writer, comp, u, _CARRIES) in sources
             for comp, u in updates)


def _whole_buffer_kernels(program: Program, param: Instruction,
                          writer: Kernel) -> list[Kernel]:
  """The kernels on the way from the parameter to its rewritten output that
  move the whole buffer (each writing all of its elements, in its dtype: a
  copy or a transpose of it), then the writer; not the buffer's other
  readers (a layer's slice for attention)."""
  dtype, elements = param.shape.element_type, product(param.shape.dims)
  entry = program.comps[writer.computation]
  # The writer's ancestors in the entry, through operands.
  ancestors: set[str] = set()
  stack = [writer.name]
  while stack:
    name = stack.pop()
    if name not in entry:
      continue
    for o in entry.instruction(name).operands:
      if o not in ancestors:
        ancestors.add(o)
        stack.append(o)
  chain: list[Kernel] = []
  frontier, seen = [param.name], {param.name}
  while frontier:
    name = frontier.pop()
    for user, _ in program.dataflow.uses.get((name, ()), ()):
      if user in seen or user not in ancestors:
        continue
      seen.add(user)
      frontier.append(user)  # (through bitcasts and tuples too)
      k = program.kernels.get(user)
      if k is not None and any(b.dtype == dtype and product(b.dims) == elements
                               for b in program.writes.get(k.name, ())):
        chain.append(k)
  return sorted(chain, key=lambda k: k.time) + [writer]


def _update_shape(comp: Computation, u: Instruction) -> tuple[str, int]:
  """(shape, bytes) one update writes: a dynamic-update-slice's update
  operand, a scatter's updates."""
  index = 1 if u.opcode == "dynamic-update-slice" else 2
  if len(u.operands) <= index or u.operands[index] not in comp:
    return "?", 0
  shape = comp.instruction(u.operands[index]).shape
  if shape is None or not shape.is_array:
    return "?", 0
  return shape.dtype_str, shape.byte_size


def _record(program: Program, p: Instruction, path: str, writer: Kernel,
            chain: list[Kernel], vid, update: str, saved: int) -> FusionDecisionRecord:
  moves = chain[:-1]
  transposed = [k for k in moves if "transpose" in k.fused_ops or k.opcode == "transpose"]
  shape = p.shape.dtype_str
  relayout = ""
  if transposed:
    seen = program.inst(transposed[0]).shape
    seen = seen.dtype_str if seen is not None else "?"
    relayout = (f"; its readers read it as {seen}: stored in that layout, the update "
                "would write its slot where they look")
  name = buffer_name(vid)
  trip = writer.trip_count
  return FusionDecisionRecord(
      kind=FindingKind.LOST_IN_PLACE, producer=writer.name,
      consumers=tuple(k.name for k in moves), boundary=name,
      boundary_shape=shape, bytes_saved=times(saved, trip),
      launches_removed=times(len(moves), trip),
      extra_arithmetic="none: the update writes its slot where the buffer is",
      extra_resources="none",
      numerical_class=NumericalClass.EXACT,
      guard="keep XLA's whole-buffer update where another reader needs the old layout",
      layout_effect=("the buffer's stored layout changes to the one its readers use"
                     if transposed else "none"),
      evidence=(f"{path} ({shape}) is donated and updated by {update} per run, but "
                f"the in-place update is lost: "
                f"{', '.join(kernel_desc(k) for k in chain)} move the whole buffer "
                f"every run, the last writing it back whole with the update inside"
                f"{relayout}"),
      verdict=Verdict.RISKY,
      reasons=("the donation's point: one slot written per run, not the whole buffer",),
      risks=("a layout change moves cost to the buffer's readers",) + COMMON_RISKS,
      ops=("in-place update lost", "relayout" if transposed else "copy"),
      trip_count=trip, source=writer.source, computation=writer.computation)
