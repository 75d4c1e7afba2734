"""Materialized buffers: one row per buffer the program writes to memory.

Each row says what wrote it (the producer kernel), who reads it (consumer
kernels, seen through tuples, get-tuple-element and bitcasts), when it lives
in schedule order, and why it exists: its byte-lifetime class, after the
method's list (external output, input or carried state, transient
intermediate, expanded broadcast, layout conversion, saved for backward,
communication staging, library workspace).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis import source as source_mod
from hlo_audit._src.analysis.dataflow import Dataflow, ValueId
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.liveness import Liveness
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, SourceLocation


class Lifetime(enum.Enum):
  """Why a buffer exists (the method's byte-lifetime classes)."""

  EXTERNAL_OUTPUT = "external output"
  INPUT = "input or carried state"
  TRANSIENT = "transient intermediate"
  EXPANDED_BROADCAST = "expanded broadcast"
  LAYOUT_CONVERSION = "layout conversion"
  SAVED_FOR_BACKWARD = "saved for backward"
  COMMUNICATION = "communication staging"
  WORKSPACE = "library workspace"


#: Ops that only move or reinterpret data: a fusion of only these (with at
#: least one copy/transpose/convert) is a layout or packing conversion.
_LAYOUT_OPS = frozenset({"copy", "transpose", "bitcast", "reshape", "convert",
                         "bitcast-convert", "tuple", "get-tuple-element"})
_CONTROL_FLOW = frozenset({"while", "conditional", "call", "async-start"})
_FORWARDING = frozenset({"get-tuple-element", "tuple", "bitcast", "opt-barrier",
                         "add-dependency", "domain"})


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
  """One materialized buffer."""

  #: Display name: the defining instruction, with `{i}` for tuple leaves.
  name: str
  instruction: str
  index: tuple[int, ...]
  computation: str
  #: e.g. "f32[128,512]".
  shape: str
  dtype: str
  dims: tuple[int, ...]
  bytes: int
  #: Kernel that writes it ("" for entry parameters).
  producer: str
  producer_opcode: str
  #: Kernels that read it, in schedule order.
  consumers: tuple[str, ...]
  #: (first, last) schedule time it is live, inclusive.
  live_range: tuple[int, int]
  lifetime: Lifetime
  source: SourceLocation | None
  op_name: str
  #: Other values sharing the buffer (loop state, donated outputs, in-place).
  aliases: tuple[str, ...] = ()
  #: Where XLA's accounting puts it: "allocation N" or "heap".
  placement: str = ""
  #: Internal to an interpreted Pallas kernel (not the user's tensor).
  internal: bool = False
  #: The stack `source` was chosen from, innermost frame first.
  source_stack: tuple[SourceLocation, ...] = ()

  @property
  def reuse_count(self) -> int:
    """How many kernels read it."""
    return len(self.consumers)


def find_buffers(module: HloModule, schedule: Schedule, dataflow: Dataflow,
                 liveness: Liveness, kernels: tuple[Kernel, ...], *,
                 library_paths: tuple[str, ...] = source_mod.DEFAULT_LIBRARY_PATHS,
                 user_paths: tuple[str, ...] = source_mod.DEFAULT_USER_PATHS) -> tuple[Buffer, ...]:
  """One row per buffer of `dataflow`, largest first (`library_paths` and
  `user_paths` choose each buffer's source frame: `source.attribute`)."""
  comps = {name: module.computation(name) for name in schedule.span}
  # Scheduled instructions by name (names are unique in a module).
  insts = {i.name: i for c in comps.values() for i in c.instructions}
  # Their op_names, read once (a buffer asks its producer's and its
  # consumers'), by identity: an Instruction hashes its whole content.
  op_name_of = {id(i): n for c in comps.values()
                for i, n in zip(c.instructions, c.op_names)}
  kernel_of: dict[str, str] = {}
  for k in kernels:
    kernel_of[k.name] = k.name
    for m in k.members:
      kernel_of[m] = k.name
  internal_members = {m for k in kernels for m in k.members}
  attribute = source_mod.attributor(module, library_paths, user_paths)
  time = schedule.time
  when = lambda k: time.get(k, 0)  # noqa: E731 - a consumer's schedule time
  values, uses = dataflow.values, dataflow.uses
  rows = []
  for buf, members in dataflow.buffers.items():
    first = values[buf]
    comp = comps[first.computation]
    inst = comp.instruction(first.instruction)
    own = kernel_of.get(first.instruction)
    consumers: list[str] = []
    seen: set[str] = set()  # a weight read by hundreds of kernels
    for v in members:
      for user, _ in uses.get(v, ()):
        user_inst = insts.get(user)
        if user_inst is None or user_inst.opcode in _NOT_READERS:
          continue
        k = kernel_of.get(user)
        if k is not None and k != own and k not in seen:
          seen.add(k)
          consumers.append(k)
    if len(consumers) > 1:
      consumers.sort(key=when)
    producer = own if own is not None else ""
    internal = first.instruction in internal_members and all(
        c == producer for c in consumers)
    op_name = op_name_of[id(inst)]
    lifetime = _lifetime(module, comps, insts, dataflow, liveness, buf, members, inst,
                         first.index, consumers, op_name, op_name_of)
    alloc = liveness.allocation_of.get(buf)
    src, stack = attribute(inst)
    leaf = first.shape
    rows.append(Buffer(
        name=first.instruction + (_index_str(first.index) if first.index else ""),
        instruction=first.instruction, index=first.index,
        computation=first.computation, shape=leaf.dtype_str,
        dtype=leaf.element_type, dims=leaf.dims, bytes=liveness.sizes[buf],
        producer=producer if inst.opcode != "parameter" else "",
        producer_opcode=inst.opcode, consumers=tuple(consumers),
        live_range=liveness.ranges[buf], lifetime=lifetime,
        source=src, source_stack=stack, op_name=op_name,
        aliases=tuple(v[0] + (_index_str(v[1]) if v[1] else "")
                      for v in members[1:]),
        placement=f"allocation {alloc}" if alloc is not None else "heap",
        internal=internal))
  rows.sort(key=lambda b: (-b.bytes, b.live_range[0]))
  return tuple(rows)


#: Users that read no buffer as a kernel: they forward it, or run bodies.
_NOT_READERS = _FORWARDING | _CONTROL_FLOW


def _index_str(index: tuple[int, ...]) -> str:
  return "{" + ",".join(map(str, index)) + "}"


def _lifetime(module: HloModule, comps, insts, dataflow: Dataflow, liveness: Liveness,
              buf: ValueId, members: tuple[ValueId, ...], inst: Instruction,
              index: tuple[int, ...], consumers: list[str], op_name: str,
              op_name_of: Mapping[int, str]) -> Lifetime:
  """Why `buf` (its values `members`, defined by `inst`) exists; `op_name`:
  `inst`'s, and `op_name_of`: every scheduled instruction's, by identity."""
  if buf in liveness.output_buffers:
    return Lifetime.EXTERNAL_OUTPUT
  opcode = inst.opcode
  if opcode in ("parameter", "constant") or buf in liveness.parameter_buffers:
    return Lifetime.INPUT
  for v in members:
    if insts[v[0]].opcode == "while":
      return Lifetime.INPUT  # carried loop state
  if opcode == "custom-call" and bt.library_of(inst.custom_call_target or ""):
    if index and inst.shape is not None and inst.shape.is_tuple and \
        index[0] == len(inst.shape.tuple_shapes) - 1 and \
        inst.shape.subshape(index).element_type in ("s8", "u8"):
      return Lifetime.WORKSPACE
  if opcode in opcodes.COLLECTIVES or opcode == "async-start" and \
      inst.async_wrapped_opcode in opcodes.COLLECTIVES:
    return Lifetime.COMMUNICATION
  users = [insts.get(c) for c in consumers]
  if users and all(u is not None and u.opcode in opcodes.COLLECTIVES for u in users):
    return Lifetime.COMMUNICATION
  # A broadcast that an in-place op (scatter, dynamic-update-slice) writes
  # into is the destination's initial contents: it must exist, and its
  # readers read the updated result.
  if len(members) == 1 and \
      expanded_broadcast_ratio(module, inst, index,
                               comps.get(dataflow.values[buf].computation)) >= 2:
    return Lifetime.EXPANDED_BROADCAST
  if is_layout_conversion(module, inst):
    return Lifetime.LAYOUT_CONVERSION
  if op_name and "transpose(" not in op_name and any(
      u is not None and "transpose(" in op_name_of[id(u)] for u in users):
    return Lifetime.SAVED_FOR_BACKWARD
  return Lifetime.TRANSIENT


def fused_root(module: HloModule, inst: Instruction, index: tuple[int, ...] = ()) -> tuple[Computation, Instruction] | None:
  """The fused computation and the root producing output `index` of a fusion."""
  if inst.opcode != "fusion":
    return None
  calls = inst.called_computations.get("calls", ())
  if not calls or calls[0] not in module:
    return None
  comp = module.computation(calls[0])
  root = comp.root
  if root.opcode == "tuple" and index:
    if index[0] >= len(root.operands):
      return None
    root = comp.instruction(root.operands[index[0]])
  return comp, root


def expanded_broadcast_ratio(module: HloModule, inst: Instruction,
                             index: tuple[int, ...] = (),
                             where: Computation | None = None) -> float:
  """Output elements per element of the compact value a broadcast expands
  (1 when the output is not an expanded broadcast). `where`: the computation
  holding `inst`, when the caller knows it (else it is searched for)."""
  if inst.shape is None:
    return 1.0
  if inst.opcode == "broadcast":
    comp, node = None, inst
  else:
    found = fused_root(module, inst, index)
    if found is None:
      return 1.0
    comp, node = found
  while node.opcode in ("bitcast", "reshape", "copy", "transpose") and comp is not None \
      and node.operands:
    node = comp.instruction(node.operands[0])
  if node.opcode != "broadcast" or node.shape is None:
    return 1.0
  out = node.shape.num_elements
  src_elements = 1
  if node.operands and comp is not None and node.operands[0] in comp:
    src = comp.instruction(node.operands[0]).shape
    src_elements = src.num_elements if src is not None else 1
  elif inst.opcode == "broadcast":
    return float(out) / max(1, _operand_elements(module, inst, where))
  return float(out) / max(1, src_elements)


def _operand_elements(module: HloModule, inst: Instruction,
                      where: Computation | None) -> int:
  for comp in (where,) if where is not None else module.computations:
    if inst.name in comp and inst.operands:
      shape = comp.instruction(inst.operands[0]).shape
      return shape.num_elements if shape is not None else 1
  return 1


def is_layout_conversion(module: HloModule, inst: Instruction) -> bool:
  """A copy or transpose, or a fusion doing nothing but copying,
  transposing, bitcasting or converting."""
  if inst.opcode in ("copy", "transpose"):
    return True
  if inst.opcode != "fusion":
    return False
  calls = inst.called_computations.get("calls", ())
  if not calls or calls[0] not in module:
    return False
  return module._cached(("layout conversion", calls[0]),
                        lambda: _only_converts(module.computation(calls[0])))


def _only_converts(comp: Computation) -> bool:
  ops = {i.opcode for i in comp.instructions if i.opcode != "parameter"}
  return bool(ops) and ops <= _LAYOUT_OPS and bool(ops & {"copy", "transpose", "convert"})
