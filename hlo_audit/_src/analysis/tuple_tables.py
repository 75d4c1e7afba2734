"""The pointer tables of tuple values, which XLA's heap holds too.

A tuple-shaped value is a table of its elements' addresses, 8 bytes each.
The dataflow leaves them out (a few bytes); XLA:GPU's heap does not: each
takes an aligned chunk of the temp allocation (256 bytes), which matters on
small programs with loops (a while's state, a multi-output fusion, an async
op each hold one or two). `tuple_tables` finds them with their live ranges
and buffers, after XLA's dataflow: a `tuple` makes its top-level table and
forwards its operands' tables; a get-tuple-element forwards one element's
and reads the table; a while's init, condition and body parameters, body
root and result share one buffer, as a call's or conditional's result does
with its callee's root; entry parameters' and the entry result's tables are
allocations of their own (not the heap).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from hlo_audit._src.analysis.dataflow import _callers, _parameter_source, _UnionFind
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo.ir import Computation, HloModule, Shape

#: Bytes of one element's address in a table.
POINTER_BYTES = 8


def pointer_table_bytes(elements: int) -> int:
  """Bytes of a table of `elements` addresses (XLA:GPU's; XLA:TPU's differ
  by generation: tpus.py)."""
  return POINTER_BYTES * elements

_FORWARDING = frozenset({"bitcast", "opt-barrier", "domain", "add-dependency"})


@dataclasses.dataclass(frozen=True, slots=True)
class Table:
  """One tuple value's pointer table."""

  #: (defining instruction, shape index of the tuple).
  value: tuple[str, tuple[int, ...]]
  #: First and last step it is live (inclusive).
  start: int
  end: int
  size: int
  #: The table it shares memory with (a loop's state: one buffer).
  buffer: tuple[str, tuple[int, ...]]


def _nodes(shape: Shape | None, prefix: tuple[int, ...] = ()):
  """(index, element count) of every tuple in `shape`, outermost first."""
  if shape is None or not shape.is_tuple:
    return
  yield prefix, len(shape.tuple_shapes)
  for k, sub in enumerate(shape.tuple_shapes):
    yield from _nodes(sub, prefix + (k,))


def tuple_tables(module: HloModule, schedule: Schedule,
                 comps: Mapping[str, Computation],
                 use_time: Mapping[str, int],
                 table_bytes: Callable[[int], int] = pointer_table_bytes) -> list[Table]:
  """The pointer tables XLA's heap holds (see the module docstring).

  Args:
    use_time: instruction -> when its reading an operand counts (liveness's
      table: a while's at the loop's start).
    table_bytes: a table's bytes from its tuple's element count.
  """
  time, span = schedule.time, schedule.span
  entry = module.entry_name
  callers = _callers(comps, time)
  holds: dict[str, dict[tuple[int, ...], tuple]] = {}
  defined: dict[tuple, tuple[str, int]] = {}  # table -> (computation, elements)
  uf = _UnionFind()

  def new(name, idx, n, comp_name):
    vid = (name, idx)
    defined[vid] = (comp_name, n)
    uf.add(vid)
    return vid

  def union(a: dict, b: dict) -> None:
    for idx, v in a.items():
      if idx in b:
        uf.union(v, b[idx])

  for comp_name, name in schedule.sequence:
    comp = comps[comp_name]
    inst = comp.instruction(name)
    op = inst.opcode
    if op == "get-tuple-element" and inst.operands:
      i = inst.tuple_index or 0
      src = holds.get(inst.operands[0], {})
      holds[name] = {idx[1:]: v for idx, v in src.items() if idx[:1] == (i,)}
      continue
    if op in _FORWARDING and inst.operands:
      holds[name] = dict(holds.get(inst.operands[0], {}))
      continue
    if op == "tuple":
      out = {(): new(name, (), len(inst.operands), comp_name)}
      for k, o in enumerate(inst.operands):  # (held: scheduled before their users)
        out.update({(k,) + idx: v for idx, v in holds[o].items()})
      holds[name] = out
      continue
    out = {idx: new(name, idx, n, comp_name) for idx, n in _nodes(inst.shape)}
    holds[name] = out
    if not out:
      continue
    if op == "parameter" and comp_name != entry and comp_name in callers:
      caller, branch = callers[comp_name]
      source = _parameter_source(caller, branch, inst.parameter_number)
      if source is not None:
        # Scheduled already: operands precede their users, and a callee runs
        # at its first caller.
        union(holds[source[0]], out)
    elif op == "while":
      union(holds.get(inst.operands[0], {}) if inst.operands else {}, out)
      for body in inst.called_computations.get("body", ()):
        if body in comps:
          union(holds.get(comps[body].root_name, {}), out)
    elif op in ("call", "conditional"):
      for callee in inst.called_computation_names():
        if callee in comps:
          union(holds.get(comps[callee].root_name, {}), out)

  ends = {vid: time[vid[0]] for vid in defined}
  for comp_name, comp in comps.items():
    for inst in comp.instructions:
      op = inst.opcode
      if op in ("tuple", "domain"):
        continue  # passes its operands' tables on, reads none
      # A get-tuple-element reads its operand's table only.
      t = time.get(inst.name) if op == "get-tuple-element" else use_time.get(inst.name)
      if t is None:
        continue
      for o in inst.operands:
        held = holds.get(o, {})
        read = ([held[()]] if () in held else []) if op == "get-tuple-element" else held.values()
        for v in read:
          if t > ends[v]:
            ends[v] = t
    for v in holds.get(comp.root_name, {}).values():
      ends[v] = max(ends[v], span[comp_name][1])
  # Entry parameters' and the result's tables are allocations, not the heap.
  excluded = {uf.find(v) for p in comps[entry].parameters for v in holds.get(p.name, {}).values()}
  excluded |= {uf.find(v) for v in holds.get(comps[entry].root_name, {}).values()}
  out = []
  for vid, (comp_name, n) in defined.items():
    buffer = uf.find(vid)
    if buffer in excluded:
      continue
    inst = comps[comp_name].instruction(vid[0])
    start = span[comp_name][0] if inst.opcode == "parameter" else time[vid[0]]
    out.append(Table(vid, start, max(start, ends[vid]), table_bytes(n), buffer))
  return out
