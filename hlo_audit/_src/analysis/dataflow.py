"""Values and buffers: which instructions write memory, and what shares it.

A *value* is data an instruction defines: one per array leaf of its shape
(tuple index tables are ignored: a few bytes of pointers). Instructions that
only forward data define nothing: `get-tuple-element`, `tuple`, `bitcast`,
`opt-barrier`, `add-dependency`, and the `*-done` halves of async pairs.

A *buffer* is a set of values that must share memory: a while's init, body
and condition parameters, body root and result; a call's, branch's or async
computation's parameters and root with the caller's operands and result; an
entry parameter donated to an output; and outputs XLA writes over an operand
(`output_to_operand_aliasing`, dynamic-update-slice and scatter, fused or not).
Optional sharing that XLA's buffer assignment *may* do (an elementwise output
taking a dying operand's memory) is left to the liveness analysis, which knows
when operands die.

Only computations that run as kernels or control flow are analysed (those of
the flattened schedule); fusion bodies and reducers belong to their callers.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping

from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, Shape

Index = tuple[int, ...]
#: A value: (defining instruction name, shape index of an array leaf).
ValueId = tuple[str, Index]

#: Instructions that forward their operand's values without writing memory.
_FORWARDING = frozenset({"get-tuple-element", "tuple", "bitcast", "opt-barrier",
                         "add-dependency", "domain"})
#: `X-done` halves: the index of the start's result their value comes from.
_DONE_SOURCE: Mapping[str, Index] = types.MappingProxyType({
    "async-done": (1,), "copy-done": (0,), "all-gather-done": (1,),
    "collective-permute-done": (1,), "send-done": (), "recv-done": (0,)})


@dataclasses.dataclass(frozen=True, slots=True)
class Value:
  """Data one instruction writes."""

  instruction: str
  index: Index
  computation: str
  shape: Shape

  @property
  def id(self) -> ValueId:
    return (self.instruction, self.index)

  @property
  def byte_size(self) -> int:
    """Bytes in the device's main memory (tiled; 0 for a value XLA keeps on
    chip or on the host): what the footprint and the traffic count."""
    return self.shape.device_byte_size


@dataclasses.dataclass(frozen=True, slots=True)
class Dataflow:
  """Values, where they appear, who reads them, and how they form buffers."""

  #: Every value, in definition (schedule) order.
  values: Mapping[ValueId, Value]
  #: instruction -> ((leaf index, value it holds), ...) for its result.
  holds: Mapping[str, tuple[tuple[Index, ValueId], ...]]
  #: value -> ((reading instruction, operand number), ...).
  uses: Mapping[ValueId, tuple[tuple[str, int], ...]]
  #: value -> buffer id (the first-defined value of its buffer).
  buffer_of: Mapping[ValueId, ValueId]
  #: buffer id -> its values, in definition order.
  buffers: Mapping[ValueId, tuple[ValueId, ...]]

  def values_of(self, inst: str) -> tuple[ValueId, ...]:
    """Values held in `inst`'s result, one per array leaf."""
    return tuple(v for _, v in self.holds.get(inst, ()))

  def buffer_bytes(self, buffer: ValueId) -> int:
    """Bytes of a buffer: its largest value (they share one allocation)."""
    return max(self.values[v].byte_size for v in self.buffers[buffer])


class _UnionFind:
  """Union-find keeping the earliest-defined value as representative."""

  __slots__ = ("parent", "rank")

  def __init__(self):
    self.parent: dict = {}
    self.rank: dict = {}

  def add(self, x) -> None:
    self.parent.setdefault(x, x)
    self.rank.setdefault(x, len(self.rank))

  def find(self, x):
    parent = self.parent
    root = x
    while parent[root] != root:
      root = parent[root]
    while parent[x] != root:
      parent[x], x = root, parent[x]
    return root

  def union(self, a, b) -> None:
    ra, rb = self.find(a), self.find(b)
    if ra != rb:
      if self.rank[rb] < self.rank[ra]:
        ra, rb = rb, ra
      self.parent[rb] = ra


def analyze_dataflow(module: HloModule, schedule: Schedule) -> Dataflow:
  """Values, uses and buffers of the instructions in `schedule`.

  Instructions are visited in schedule order, so a callee's parameters are
  seen after the caller's operands and its root before the caller's result.
  """
  values: dict[ValueId, Value] = {}
  holds: dict[str, list[tuple[Index, ValueId]]] = {}
  uses: dict[ValueId, list[tuple[str, int]]] = {}
  uf = _UnionFind()
  comps = {name: module.computation(name) for name in schedule.span}
  callers = _callers(comps, schedule.time)

  def held(name: str) -> dict[Index, ValueId]:
    return dict(holds.get(name, ()))

  def define(inst: Instruction, comp: Computation,
             skip: Mapping[Index, int] = types.MappingProxyType({})
             ) -> list[tuple[Index, ValueId]]:
    out = []
    for index, leaf in _array_leaves(inst.shape):
      if index in skip:
        continue
      vid = (inst.name, index)
      values[vid] = Value(inst.name, index, comp.name, leaf)
      uf.add(vid)
      out.append((index, vid))
    holds[inst.name] = out
    return out

  def forward(inst: Instruction, pairs) -> None:
    holds[inst.name] = [(i, v) for i, v in pairs if v is not None]

  for comp_name, name in schedule.sequence:
    comp = comps[comp_name]
    inst = comp.instruction(name)
    op = inst.opcode
    for k, operand in enumerate(inst.operands):
      for _, vid in holds.get(operand, ()):
        uses.setdefault(vid, []).append((inst.name, k))
    if op == "parameter":
      define(inst, comp)
      caller = callers.get(comp_name)
      if caller is not None and comp_name != module.entry_name:
        source = _parameter_source(caller[0], caller[1], inst.parameter_number)
        if source is not None:
          operand, prefix = source
          src = held(operand)
          for index, vid in holds[inst.name]:
            if prefix + index in src:
              uf.union(src[prefix + index], vid)
      continue
    if op in _FORWARDING:
      if op == "get-tuple-element":
        i = inst.tuple_index or 0
        src = held(inst.operands[0])
        forward(inst, [(idx[1:], v) for idx, v in src.items() if idx[:1] == (i,)])
      elif op == "tuple":
        pairs = []
        for k, operand in enumerate(inst.operands):
          pairs += [((k,) + idx, v) for idx, v in held(operand).items()]
        forward(inst, pairs)
      elif inst.operands:
        forward(inst, list(held(inst.operands[0]).items()))
      continue
    if op in _DONE_SOURCE or (op == "all-reduce-done" and inst.operands):
      start = held(inst.operands[0]) if inst.operands else {}
      leaves = _array_leaves(inst.shape)
      if op == "all-reduce-done":
        # The start holds the results as the done does (an array, or a
        # combined all-reduce's tuple), or ((operands), results) as newer
        # XLA prints it (or (operand, result)): then the done is element 1.
        base = () if all(idx in start for idx, _ in leaves) else (1,)
      else:
        base = _DONE_SOURCE[op]
      pairs = [(idx, start.get(base + idx)) for idx, _ in leaves]
      if pairs and all(v is not None for _, v in pairs):
        forward(inst, pairs)
        continue
    aliased = _start_operands(inst, comp) if op in _STARTS else None
    if aliased:
      # The leaves that are the start's operands hold their values (the
      # operands stay live until the done); the rest are the start's own.
      held_operands = [(index, held(inst.operands[k]).get(())) for index, k in aliased.items()]
      holds[inst.name] = sorted(define(inst, comp, skip=aliased) +
                                [(i, v) for i, v in held_operands if v is not None])
    else:
      define(inst, comp)
    if op == "while" and inst.operands:
      _union_at(uf, holds, inst.operands[0], (), inst.name, ())
      for body in inst.called_computations.get("body", ()):
        if body in comps:
          _union_at(uf, holds, comps[body].root_name, (), inst.name, ())
    elif op in ("call", "conditional"):
      for callee in inst.called_computation_names():
        if callee in comps:
          _union_at(uf, holds, comps[callee].root_name, (), inst.name, ())
    elif op == "async-start":
      for k, operand in enumerate(inst.operands):
        _union_at(uf, holds, operand, (), inst.name, (0, k))
      for callee in inst.called_computation_names():
        if callee in comps:
          _union_at(uf, holds, comps[callee].root_name, (), inst.name, (1,))
    for out_index, operand_number, operand_index in in_place_pairs(inst, module):
      if operand_number < len(inst.operands):
        _union_at(uf, holds, inst.operands[operand_number], operand_index,
                  inst.name, out_index, exact=True)
  # Donated entry parameters share the output buffer they alias.
  entry = module.entry
  params = {p.parameter_number: p.name for p in entry.parameters}
  for alias in module.input_output_alias:
    if alias.parameter in params:
      src = held(params[alias.parameter]).get(alias.parameter_index)
      dst = held(entry.root_name).get(alias.output_index)
      if src is not None and dst is not None:
        uf.union(src, dst)
  buffer_of = {v: uf.find(v) for v in values}
  buffers: dict[ValueId, list[ValueId]] = {}
  for v in values:
    buffers.setdefault(buffer_of[v], []).append(v)
  return Dataflow(
      values=types.MappingProxyType(values),
      holds=types.MappingProxyType({k: tuple(v) for k, v in holds.items()}),
      uses=types.MappingProxyType({k: tuple(v) for k, v in uses.items()}),
      buffer_of=types.MappingProxyType(buffer_of),
      buffers=types.MappingProxyType({k: tuple(v) for k, v in buffers.items()}))


def with_output_aliases(dataflow: Dataflow, module: HloModule,
                        aliases: Iterable[tuple[Index, int, Index]]) -> Dataflow:
  """What `analyze_dataflow` makes of `module` with these input/output aliases
  added, as (output index, parameter number, parameter index), without
  walking the module again: an alias only merges the parameter's buffer with
  the output's (the last step above), so values, holds and uses are
  `dataflow`'s own. Each merged buffer keeps its earliest-defined value as
  id, and its values stay in definition order."""
  entry = module.entry
  params = {p.parameter_number: p.name for p in entry.parameters}
  holds, buffer_of = dataflow.holds, dataflow.buffer_of
  out = dict(holds.get(entry.root_name, ()))
  uf = _UnionFind()
  for b in dataflow.buffers:  # in definition order: ranks keep the earliest
    uf.add(b)
  merges = 0
  for out_index, number, index in aliases:
    if number not in params:
      continue
    src = dict(holds.get(params[number], ())).get(index)
    dst = out.get(out_index)
    if src is not None and dst is not None and \
        uf.find(buffer_of[src]) != uf.find(buffer_of[dst]):
      uf.union(buffer_of[src], buffer_of[dst])
      merges += 1
  if not merges:
    return dataflow
  groups: dict[ValueId, list[ValueId]] = {}
  for b in dataflow.buffers:
    root = uf.find(b)
    if root != b:
      groups.setdefault(root, [root]).append(b)
  position = {v: i for i, v in enumerate(dataflow.values)}
  new_buffer_of = dict(buffer_of)
  buffers: dict[ValueId, tuple[ValueId, ...]] = {}
  for b, members in dataflow.buffers.items():
    root = uf.find(b)
    if root != b:
      continue  # inside its root's group, emitted at the root (first) below
    if root in groups:
      members = tuple(sorted((v for m in groups[root] for v in dataflow.buffers[m]),
                             key=position.__getitem__))
      for v in members:
        new_buffer_of[v] = root
    buffers[root] = members
  return dataclasses.replace(
      dataflow, buffer_of=types.MappingProxyType(new_buffer_of),
      buffers=types.MappingProxyType(buffers))


#: Asynchronous starts whose result holds their operands beside what they
#: write (XLA's dataflow forwards the operands' values there).
_STARTS = frozenset({"all-gather-start", "all-reduce-start", "collective-permute-start",
                     "copy-start", "send"})


def _start_operands(inst: Instruction, comp: Computation) -> dict[Index, int]:
  """{leaf index: operand number} of the leaves of an asynchronous start's
  result that are its operands, as XLA's dataflow reads them: `copy-start`'s
  (destination, operand, context) and `send`'s (operand, context, token);
  the collectives' ((operands), results[, contexts]), or (operand, result[,
  contexts]) for one operand. A combined all-reduce's tuple of results holds
  no operand. A leaf whose shape is not its operand's is left out."""
  shape, operands = inst.shape, inst.operands
  if shape is None or not shape.is_tuple or not shape.tuple_shapes or not operands:
    return {}
  op = inst.opcode
  if op == "copy-start":
    pairs = {(1,): 0}
  elif op == "send":
    pairs = {(0,): 0}
  else:
    first = shape.tuple_shapes[0]
    if first.is_tuple:
      pairs = {(0, k): k for k in range(len(operands))}
    elif op != "all-reduce-start" or (len(operands) == 1 and len(shape.tuple_shapes) == 2):
      pairs = {(0,): 0}
    else:
      return {}
  out = {}
  for index, k in pairs.items():
    if k >= len(operands) or operands[k] not in comp:
      continue
    try:
      leaf = shape.subshape(index)
    except IndexError:
      continue
    src = comp.instruction(operands[k]).shape
    if leaf.is_array and src is not None and src.is_array and \
        (leaf.element_type, leaf.dims) == (src.element_type, src.dims):
      out[index] = k
  return out


def _array_leaves(shape: Shape | None):
  if shape is None:
    return ()
  return [(i, s) for i, s in shape.leaves() if s.is_array]


def _union_at(uf: _UnionFind, holds, src_inst: str, src_prefix: Index,
              dst_inst: str, dst_prefix: Index, exact: bool = False) -> None:
  """Unions values of `src_inst` under `src_prefix` with those of `dst_inst`
  under `dst_prefix`, leaf by leaf (`exact`: only the leaf at the prefix)."""
  src = dict(holds.get(src_inst, ()))
  dst = dict(holds.get(dst_inst, ()))
  for index, vid in src.items():
    if index[:len(src_prefix)] != src_prefix:
      continue
    rest = index[len(src_prefix):]
    if exact and rest:
      continue
    other = dst.get(dst_prefix + rest)
    if other is not None:
      uf.union(vid, other)


def _callers(comps: Mapping[str, Computation],
             time: Mapping[str, int]) -> dict[str, tuple[Instruction, int]]:
  """computation -> (the first scheduled instruction calling it, the branch
  number when it is a conditional's branch, else 0).

  The schedule runs a callee once, at its first caller (`time`: the
  schedule's step of each instruction): a computation that hand-written HLO
  calls from two places takes its parameters from that caller's operands,
  which are the ones already scheduled."""
  out: dict[str, tuple[Instruction, int]] = {}
  for comp in comps.values():
    for inst in comp.instructions:
      if inst.opcode not in ("while", "conditional", "call", "async-start"):
        continue
      called = inst.called_computations
      branches = called.get("branch_computations") or (
          called.get("true_computation", ()) + called.get("false_computation", ()))
      at = time.get(inst.name)
      for callee in inst.called_computation_names():
        if callee in comps and (callee not in out or (
            at is not None and at < time.get(out[callee][0].name, at + 1))):
          k = branches.index(callee) if callee in branches else 0
          out[callee] = (inst, k)
  return out


def _parameter_source(caller: Instruction, branch: int, number: int | None):
  """(operand, index prefix) a callee parameter receives from its caller."""
  if number is None:
    return None
  op = caller.opcode
  if op == "while":
    operand = 0
  elif op in ("call", "async-start"):
    operand = number
  elif op == "conditional":
    operand = 1 + branch  # operand 0 is the branch index
  else:
    return None
  return (caller.operands[operand], ()) if operand < len(caller.operands) else None


def in_place_pairs(inst: Instruction, module: HloModule):
  """(output index, operand number, operand index) pairs XLA must write in
  place: declared aliasing, and dynamic-update-slice/scatter (fused or not)."""
  for alias in inst.output_to_operand_aliasing:
    yield alias.output_index, alias.operand, alias.operand_index
  op = inst.opcode
  if op in ("dynamic-update-slice", "scatter"):
    yield (), 0, ()
  elif op == "fusion":
    calls = inst.called_computations.get("calls", ())
    if not calls or calls[0] not in module:
      return
    fused = module.computation(calls[0])
    root = fused.root
    outputs = ([((k,), fused.instruction(n)) for k, n in enumerate(root.operands)]
               if root.opcode == "tuple" else [((), root)])
    for out_index, out in outputs:
      if out.opcode in ("dynamic-update-slice", "scatter") and out.operands:
        src = _through_bitcasts(fused, out.operands[0])
        if src is not None and src.opcode == "parameter":
          yield out_index, src.parameter_number or 0, ()


def _through_bitcasts(comp: Computation, name: str) -> Instruction | None:
  inst = comp.instruction(name) if name in comp else None
  while inst is not None and inst.opcode == "bitcast" and inst.operands:
    inst = comp.instruction(inst.operands[0])
  return inst
