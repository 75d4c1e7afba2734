"""XLA's BufferAssignmentProto, read without generated protobuf code."""

from __future__ import annotations

import pytest

from hlo_audit._src.hlo.buffer_assignment_proto import (
    ProtoError, allocated_bytes, instruction_names, parse_buffer_assignment_proto)


def _varint(v: int) -> bytes:
  out = bytearray()
  while True:
    b = v & 0x7F
    v >>= 7
    out.append(b | (0x80 if v else 0))
    if not v:
      return bytes(out)


def _field(num: int, value) -> bytes:
  if isinstance(value, int):
    return _varint(num << 3) + _varint(value)
  return _varint(num << 3 | 2) + _varint(len(value)) + value


UID = (3 << 32) | 7  # computation 3, instruction 7


def _module() -> bytes:
  inst = _field(1, b"fusion.2") + _field(35, UID)
  comp = _field(1, b"main") + _field(2, inst) + _field(5, 3)
  return _field(3, comp)


def _assignment() -> bytes:
  location = _field(4, UID) + _field(3, _varint(1))  # shape index {1}
  logical = _field(1, 9) + _field(2, 4096) + _field(3, location)
  assigned = _field(1, 9) + _field(2, 128) + _field(3, 4096)
  param = _field(1, 0) + _field(2, 64) + _field(5, 1) + _field(6, 2)
  temp = _field(1, 1) + _field(2, 8192) + _field(7, 1) + _field(9, assigned)
  local = _field(1, 2) + _field(2, 16) + _field(3, 1)
  return (_field(1, logical) + _field(3, temp) + _field(3, param) +
          _field(3, local))


def test_allocations_values_and_names():
  ba = parse_buffer_assignment_proto(_assignment(), _module())
  param, temp, local = ba.allocations  # sorted by index
  assert (param.kind, param.parameter_number, param.size) == ("parameter", 2, 64)
  assert (temp.kind, temp.size, temp.maybe_live_out) == ("output", 8192, True)
  (v,) = temp.values
  assert (v.instruction, v.shape_index, v.offset, v.size) == ("fusion.2", (1,), 128, 4096)
  assert local.is_thread_local and local.kind == "thread-local"
  assert instruction_names(_module(), {UID}) == {UID: "fusion.2"}


def test_allocated_bytes_sum_every_allocation_but_thread_local_scratch():
  # The parameter's 64 and the output's 8192; not the 16 thread-local bytes.
  assert allocated_bytes(_assignment()) == 64 + 8192
  assert allocated_bytes(_assignment()) == parse_buffer_assignment_proto(
      _assignment(), _module()).allocated_bytes()
  # A thread-local flag written before the size still leaves it out; an
  # allocation at size 0 (proto3 omits it) adds nothing.
  flag_first = _field(3, _field(3, 1) + _field(2, 48)) + _field(3, _field(1, 5))
  assert allocated_bytes(flag_first) == 0
  assert allocated_bytes(b"") == 0
  with pytest.raises(ProtoError):
    allocated_bytes(b"\x1a\x10\x08")  # a length past the end


def test_an_allocation_without_an_index_field_is_allocation_0():
  # proto3 leaves out fields at their zero value: allocation 0 carries no index.
  (alloc,) = parse_buffer_assignment_proto(_field(3, _field(2, 32) + _field(3, 1)),
                                           _module()).allocations
  assert (alloc.index, alloc.size, alloc.is_thread_local) == (0, 32, True)


def test_an_allocation_without_a_color_is_in_memory_space_0():
  # proto3 omits color 0 (device memory); a color written is kept.
  default, other = parse_buffer_assignment_proto(
      _field(3, _field(1, 1) + _field(2, 32)) + _field(3, _field(1, 2) + _field(2, 32)
                                                      + _field(8, 1)),
      _module()).allocations
  assert (default.index, default.color) == (1, 0)
  assert (other.index, other.color) == (2, 1)


def test_a_shape_index_written_unpacked_is_the_index_not_the_instruction():
  # proto2 writers send a repeated int64 one varint at a time (wire type 0).
  location = _field(4, UID) + _field(3, 1) + _field(3, 0)  # shape index {1, 0}
  logical = _field(1, 9) + _field(2, 64) + _field(3, location)
  alloc = _field(1, 1) + _field(2, 64) + _field(9, _field(1, 9) + _field(3, 64))
  (a,) = parse_buffer_assignment_proto(_field(1, logical) + _field(3, alloc),
                                       _module()).allocations
  (v,) = a.values
  assert (v.instruction, v.shape_index) == ("fusion.2", (1, 0))


def test_a_value_without_a_buffer_field_is_logical_buffer_0():
  # proto3 leaves out zero values: logical buffer 0 carries no id, and the
  # allocation's `assigned` entry for it no logical_buffer_id; it is still
  # buffer 0, named by the instruction that defines it.
  location = _field(4, UID) + _field(3, _varint(0))  # shape index {0}
  logical = _field(2, 256) + _field(3, location)  # id 0 omitted
  other = _field(1, 1) + _field(2, 64) + _field(3, _field(4, 5))  # buffer 1
  assigned = _field(2, 32) + _field(3, 256)  # logical_buffer_id 0 omitted
  alloc = _field(1, 4) + _field(2, 512) + _field(9, assigned)
  proto = _field(1, logical) + _field(1, other) + _field(3, alloc)
  (a,) = parse_buffer_assignment_proto(proto, _module()).allocations
  (v,) = a.values
  assert (v.id, v.instruction, v.shape_index) == (0, "fusion.2", (0,))
  assert (v.offset, v.size) == (32, 256)


def test_unknown_ids_are_named_by_id_and_bad_bytes_raise():
  ba = parse_buffer_assignment_proto(_assignment())  # no module proto
  assert ba.allocations[1].values[0].instruction == f"#{UID}"
  # A value whose logical buffer the proto does not list: named by its id.
  alloc = _field(1, 1) + _field(2, 64) + _field(9, _field(1, 42) + _field(3, 64))
  (a,) = parse_buffer_assignment_proto(_field(3, alloc)).allocations
  assert [(v.id, v.instruction, v.shape_index) for v in a.values] == [(42, "#buffer42", ())]
  with pytest.raises(ProtoError, match="truncated"):
    parse_buffer_assignment_proto(bytes([0x08, 0x80]))  # a varint cut short
  with pytest.raises(ProtoError, match="past the end"):
    parse_buffer_assignment_proto(_assignment()[:-3])
  with pytest.raises(ProtoError, match="wire type"):
    parse_buffer_assignment_proto(bytes([0x0B]))  # wire type 3 (groups)
