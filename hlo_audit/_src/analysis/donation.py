"""Donation: the aliases JAX would add for donated arguments, and XLA's copies.

A donation what-if (`replay.replay(donate=...)`) gives the module the
`input_output_alias` entries JAX would add (each donated leaf aliased to the
first free output of the same shape and dtype, in order); dataflow and
liveness then run on that module. The memory findings ask the same question
of every argument not donated.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence

from hlo_audit._src.analysis.dataflow import Dataflow
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo.ir import HloModule, Instruction, ModuleAlias


def donation_aliases(module: HloModule, dataflow: Dataflow,
                     parameters: Sequence[int]) -> list[tuple[tuple[int, ...], int]]:
  """(output index, parameter) pairs JAX's donation would add: each donated
  parameter, in order, takes the first output of its shape and dtype not
  aliased already and not itself a parameter passed through."""
  entry = module.entry
  root = entry.instruction(entry.root_name)
  taken = {a.output_index for a in module.input_output_alias}
  already = {a.parameter for a in module.input_output_alias}
  params = {p.parameter_number: p for p in entry.parameters}
  # (element type, dims) -> the outputs of that type, in order, the first
  # not taken yet at `next_free[key]` (a donation replay names every leaf).
  outputs: dict[tuple, list[tuple[int, ...]]] = {}
  for index, vid in dataflow.holds.get(root.name, ()):
    inst = entry.instruction(vid[0]) if vid[0] in entry else None
    if inst is not None and inst.opcode == "parameter":
      continue  # an argument returned as is: JAX does not alias it
    leaf = root.shape.subshape(index)
    outputs.setdefault((leaf.element_type, tuple(leaf.dims)), []).append(index)
  next_free = dict.fromkeys(outputs, 0)
  pairs = []
  for n in parameters:
    p = params[n]
    if n in already or p.shape is None or p.shape.is_tuple:
      continue
    key = (p.shape.element_type, tuple(p.shape.dims))
    candidates = outputs.get(key, ())
    i = next_free.get(key, 0)
    while i < len(candidates) and candidates[i] in taken:
      i += 1
    if i < len(candidates):
      taken.add(candidates[i])
      pairs.append((candidates[i], n))
      i += 1
    next_free[key] = i
  return pairs


def with_donation(module: HloModule, pairs: Sequence[tuple[tuple[int, ...], int]]) -> HloModule:
  """`module` with `input_output_alias` entries for `pairs` added."""
  entries = [f"{{{','.join(map(str, a.output_index))}}}: ({a.parameter}, "
             f"{{{','.join(map(str, a.parameter_index))}}}, "
             f"{'must-alias' if a.must_alias else 'may-alias'})"
             for a in module.input_output_alias]
  entries += [f"{{{','.join(map(str, index))}}}: ({n}, {{}}, may-alias)"
              for index, n in pairs]
  attributes = dict(module.attributes)
  attributes["input_output_alias"] = "{ " + ", ".join(entries) + " }"
  donated = dataclasses.replace(module, attributes=types.MappingProxyType(attributes))
  # The entries as parsed, so that no reader lexes the text just written.
  aliases = module.input_output_alias + tuple(
      ModuleAlias(output_index=tuple(index), parameter=n, parameter_index=())
      for index, n in pairs)
  donated._cached("input_output_alias", lambda: aliases)
  return donated


def with_copies(module: HloModule, parameters: Sequence[int]) -> tuple[HloModule, int]:
  """`module` with the copies XLA's copy insertion adds for donated
  `parameters` (see `aliasing_copies`) made instructions: each parameter
  copied once, where XLA's scheduler puts such copies (before the entry's
  first instruction that is not a parameter or a constant), and every other
  reader reading the copy. Returns the module and the copies' first position
  in the entry (times from there on move by `len(parameters)`).

  Replaying the copies as instructions, not as intervals beside the heap,
  lets the buffer assigner place them as XLA does: in an allocation another
  value leaves free, often, rather than on top of the heap.
  """
  entry = module.entry
  by_number = {p.parameter_number: p for p in entry.parameters}
  taken = {i.name for _, i in module.instructions()}
  renamed: dict[str, str] = {}
  copies = []
  for n in parameters:
    p = by_number[n]
    name = f"{p.name}.donated_copy"
    while name in taken:
      name += "_"
    taken.add(name)
    renamed[p.name] = name
    copies.append(Instruction(name=name, opcode="copy", shape=p.shape, operands=(p.name,)))
  at = next((k for k, i in enumerate(entry.instructions)
             if i.opcode not in ("parameter", "constant")), len(entry.instructions))
  rest = [dataclasses.replace(i, operands=tuple(renamed.get(o, o) for o in i.operands))
          if any(o in renamed for o in i.operands) else i
          for i in entry.instructions[at:]]
  new_entry = dataclasses.replace(
      entry, instructions=(*entry.instructions[:at], *copies, *rest),
      root_name=entry.root_name)
  computations = tuple(new_entry if c.name == entry.name else c for c in module.computations)
  return dataclasses.replace(module, computations=computations), at


def aliasing_copies(module: HloModule, dataflow: Dataflow, schedule: Schedule,
                    pairs: Sequence[tuple[tuple[int, ...], int]], *,
                    reorders: bool = False) -> list[tuple[int, int, int, int]]:
  """The copies XLA's copy insertion adds for donated parameters, as
  (parameter, first, last, bytes).

  XLA:CPU (`reorders` False): a donated parameter read by an instruction
  that is neither the aliased output's writer nor one of its dataflow
  ancestors may run after the output overwrote it, so XLA copies the
  parameter and every read takes the copy; replayed, its copies give its
  footprint within 0.1% on the suite. XLA:GPU (`reorders` True) orders such
  reads before the write with control edges and copies only a parameter
  some reader of which depends on the writer (it must run after the
  write); it also schedules the donated program again, which a replay on
  the audited schedule does not, so there the replay is an estimate
  (within about 10% on the suite). The scheduler puts the copies first, so
  a copy lives from the entry's first step after its parameters and
  constants to the parameter's last read, and the parameter itself only
  until the copy."""
  entry = module.entry
  root = entry.instruction(entry.root_name)
  out_value = dict(dataflow.holds.get(root.name, ()))
  params = {p.parameter_number: p for p in entry.parameters}
  time = schedule.time
  readers_of = {n: [u for u, _ in dataflow.uses.get((params[n].name, ()), ())]
                for _, n in pairs if n in params}
  # Which readers (CPU) or writers (GPU) each instruction depends on, as
  # bits: one pass in text order (operands and control predecessors come
  # first), not a search of the entry per output.
  marked = ({out_value[index][0] for index, _ in pairs if index in out_value} if reorders
            else [u for readers in readers_of.values() for u in readers])
  bit = {u: 1 << k for k, u in enumerate(dict.fromkeys(u for u in marked if u in entry))}
  reach: dict[str, int] = {}
  if bit:
    for inst in entry.instructions:
      found = 0
      for o in (*inst.operands, *inst.control_predecessors):
        found |= reach.get(o, 0) | bit.get(o, 0)
      reach[inst.name] = found
  first = min((time[i.name] for i in entry.instructions
                if i.opcode not in ("parameter", "constant") and i.name in time),
               default=0)
  out = []
  for index, n in pairs:
    p = params[n]
    writer = out_value[index][0]
    if writer not in entry:
      continue
    readers = readers_of[n]
    if reorders:
      # Only a read that must follow the write needs the copy.
      if not any(u in entry and u != writer and reach.get(u, 0) & bit[writer]
                 for u in readers):
        continue
    else:
      before = reach.get(writer, 0)
      if all(u in entry and (u == writer or bit[u] & before) for u in readers):
        continue
    times = [time[u] for u in readers if u in time]
    if times:
      out.append((n, min(first, min(times)), max(times), p.shape.byte_size))
  return out
