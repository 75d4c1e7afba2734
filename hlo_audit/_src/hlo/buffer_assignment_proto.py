"""XLA's buffer assignment from `serialized_buffer_assignment_proto`.

`Compiled.memory_analysis()` carries XLA's `BufferAssignmentProto` in every
jaxlib we support, so the allocations behind "XLA's peak" come from the
executable jit already built, with no second compile. The proto names the
instruction that defines each value by its unique id, which HLO text does not
print; the ids are mapped to names through the executable's
`HloModuleProto` (`instructions { name = 1, id = 35 }`), read here with a
minimal protobuf wire reader: jaxlib ships no Python classes for these
messages, and a dependency on generated code would tie us to one XLA.

Field numbers follow `xla/service/hlo.proto` (stable across the jaxlib
versions we support; the compat facts say which carry the proto).
"""

from __future__ import annotations

from collections.abc import Iterator

from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.hlo.xla_reports import (Allocation, AssignedValue,
                                            BufferAssignment)

# BufferAssignmentProto
_LOGICAL_BUFFERS, _ALLOCATIONS = 1, 3
# LogicalBufferProto and its Location
_LB_ID, _LB_SIZE, _LB_DEFINED_AT, _LB_COLOR = 1, 2, 3, 4
_LOC_NAME, _LOC_SHAPE_INDEX, _LOC_INSTRUCTION_ID = 2, 3, 4
# BufferAllocationProto and its Assigned
(_A_INDEX, _A_SIZE, _A_THREAD_LOCAL, _A_ENTRY_PARAM, _A_PARAM_NUMBER,
 _A_LIVE_OUT, _A_COLOR, _A_ASSIGNED, _A_CONSTANT) = 1, 2, 3, 5, 6, 7, 8, 9, 12
_AS_BUFFER, _AS_OFFSET, _AS_SIZE = 1, 2, 3
# HloModuleProto -> HloComputationProto -> HloInstructionProto
_M_COMPUTATIONS, _C_INSTRUCTIONS, _C_ID, _I_NAME, _I_ID = 3, 2, 5, 1, 35


class ProtoError(HloAuditError):
  """The serialized proto is not what XLA writes."""


def _fields(buf: bytes, pos: int = 0,
            end: int | None = None) -> Iterator[tuple[int, int, object]]:
  """(field number, wire type, value) of a message: varints as ints,
  length-delimited fields as (start, end) offsets into `buf`."""
  end = len(buf) if end is None else end
  try:
    while pos < end:
      key = buf[pos]
      pos += 1
      if key >= 0x80:
        key &= 0x7F
        shift = 7
        while True:
          b = buf[pos]
          pos += 1
          key |= (b & 0x7F) << shift
          shift += 7
          if b < 0x80:
            break
      wire = key & 7
      if wire == 0 or wire == 2:
        v = buf[pos]
        pos += 1
        if v >= 0x80:
          v &= 0x7F
          shift = 7
          while True:
            b = buf[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
              break
        if wire == 0:
          yield key >> 3, 0, v
        else:
          if pos + v > end:
            raise ProtoError("a field runs past the end of its message")
          yield key >> 3, 2, (pos, pos + v)
          pos += v
      elif wire == 1:
        pos += 8
      elif wire == 5:
        pos += 4
      else:
        raise ProtoError(f"unsupported wire type {wire}")
  except IndexError:
    raise ProtoError("truncated message") from None


def _packed(buf: bytes, span: tuple[int, int]) -> tuple[int, ...]:
  """The varints of a packed repeated field."""
  pos, end = span
  out = []
  try:
    while pos < end:
      v = 0
      shift = 0
      while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
          break
      out.append(v)
  except IndexError:
    raise ProtoError("truncated packed field") from None
  return tuple(out)


def _signed(v: int) -> int:
  return v - (1 << 64) if v >= 1 << 63 else v


def instruction_names(module_proto: bytes,
                      wanted: set[int] | None = None) -> dict[int, str]:
  """Unique id -> instruction name, from a serialized `HloModuleProto`.

  With `wanted`, only computations that may hold those ids are read: XLA's
  unique ids put the computation's id in the high 32 bits, and reading the
  fused computations' instructions would cost more than the rest of the
  decode. Should that layout not hold, every computation is read.
  """
  out: dict[int, str] = {}
  comps = [span for num, wire, span in _fields(module_proto)
           if num == _M_COMPUTATIONS and wire == 2]
  if wanted is not None:
    high = {uid >> 32 for uid in wanted}
    first = [c for c in comps if _computation_id(module_proto, c) in high]
    for span in first:
      _read_names(module_proto, span, out)
    if wanted.issubset(out):
      return out
    comps = [c for c in comps if c not in first]
  for span in comps:
    _read_names(module_proto, span, out)
  return out


def _computation_id(buf: bytes, span) -> int | None:
  for num, wire, v in _fields(buf, *span):
    if num == _C_ID and wire == 0:
      return v
  return None


def _read_names(buf: bytes, span, out: dict[int, str]) -> None:
  for num, wire, inst in _fields(buf, *span):
    if num != _C_INSTRUCTIONS or wire != 2:
      continue
    name = None
    uid = None
    for inum, iwire, v in _fields(buf, *inst):
      if inum == _I_NAME and iwire == 2:
        name = buf[v[0]:v[1]].decode("utf-8", "replace")
      elif inum == _I_ID and iwire == 0:
        uid = v
    if name is not None and uid is not None:
      out[uid] = name


def parse_buffer_assignment_proto(proto: bytes,
                                  module_proto: bytes | None = None) -> BufferAssignment:
  """`BufferAssignment` from a serialized `BufferAssignmentProto`.

  Instruction ids are named through `module_proto` (the executable's
  `HloModuleProto`); without it, or for an id it lacks, a value is named
  `#<id>`. Shapes are not in the proto: `shape` is "".

  Raises:
    ProtoError: for bytes that are not such a proto.
  """
  located: dict[int, tuple[str, int | None, tuple[int, ...]]] = {}
  spans = []
  for num, wire, span in _fields(proto):
    if wire != 2:
      continue
    if num == _LOGICAL_BUFFERS:
      bid = 0
      where = ("", None, ())
      for lnum, lwire, v in _fields(proto, *span):
        if lnum == _LB_ID and lwire == 0:
          bid = v
        elif lnum == _LB_DEFINED_AT and lwire == 2:
          where = _location(proto, v)
      located[bid] = where
    elif num == _ALLOCATIONS:
      spans.append(span)
  wanted = {uid for name, uid, _ in located.values() if not name and uid is not None}
  names = instruction_names(module_proto, wanted) if wanted and module_proto else {}
  buffers = {bid: (name or names.get(uid, f"#{uid}"), index)
             for bid, (name, uid, index) in located.items()}
  allocations = sorted((_allocation(proto, span, buffers) for span in spans),
                       key=lambda a: a.index)
  return BufferAssignment(tuple(allocations))


def allocated_bytes(proto: bytes) -> int:
  """The bytes of every allocation but thread-local scratch (what XLA's peak
  sums), read without decoding the logical buffers or naming any value.

  Raises:
    ProtoError: for bytes that are not such a proto.
  """
  total = 0
  for num, wire, span in _fields(proto):
    if num == _ALLOCATIONS and wire == 2:
      size = 0
      thread_local = False
      for anum, awire, v in _fields(proto, *span):
        if awire == 0:
          if anum == _A_SIZE:
            size = _signed(v)
          elif anum == _A_THREAD_LOCAL:
            thread_local = bool(v)
      if not thread_local:
        total += size
  return total


def _location(proto: bytes, span) -> tuple[str, int | None, tuple[int, ...]]:
  name = ""
  index: tuple[int, ...] = ()
  uid = None
  for num, wire, v in _fields(proto, *span):
    if num == _LOC_NAME and wire == 2:
      name = proto[v[0]:v[1]].decode("utf-8", "replace")
    elif num == _LOC_INSTRUCTION_ID and wire == 0:
      uid = v
    elif num == _LOC_SHAPE_INDEX:
      index = _packed(proto, v) if wire == 2 else index + (v,)
  return name, uid, index


def _allocation(proto: bytes, span, buffers) -> Allocation:
  fields = {}
  values = []
  for num, wire, v in _fields(proto, *span):
    if num == _A_ASSIGNED and wire == 2:
      a = {n: x for n, w, x in _fields(proto, *v) if w == 0}
      bid = a.get(_AS_BUFFER, 0)
      name, index = buffers.get(bid, (f"#buffer{bid}", ()))
      values.append(AssignedValue(id=bid, instruction=name, shape_index=index,
                                  size=a.get(_AS_SIZE, 0),
                                  offset=a.get(_AS_OFFSET, 0), shape=""))
    elif wire == 0:
      fields[num] = v
  is_param = bool(fields.get(_A_ENTRY_PARAM))
  return Allocation(
      index=fields.get(_A_INDEX, 0), size=_signed(fields.get(_A_SIZE, 0)),
      parameter_number=fields.get(_A_PARAM_NUMBER, 0) if is_param else None,
      maybe_live_out=bool(fields.get(_A_LIVE_OUT)),
      is_thread_local=bool(fields.get(_A_THREAD_LOCAL)),
      is_constant=bool(fields.get(_A_CONSTANT)),
      color=fields.get(_A_COLOR, 0), values=tuple(values))
