"""XLA's text reports of a compile, read: the buffer assignment (what each
allocation holds, of which kind, how many bytes "XLA's peak" sums) and the
live ranges (the schedule, each value's range, the values at the peak).
The first of each is the report XLA:CPU wrote for
`jnp.tanh(x @ w).sum(0)` on f32[8,16] and f32[16,4] (jax 0.10.2)."""

from __future__ import annotations

import pytest

from hlo_audit._src.errors import HloParseError
from hlo_audit._src.hlo import xla_reports

_CPU_ASSIGNMENT = """\
BufferAssignment:
allocation 0: size 512, parameter 0, shape |f32[8,16]| at ShapeIndex {}:
 value: <10 x.1 @0> (size=512,offset=0): f32[8,16]{1,0}
allocation 1: size 256, parameter 1, shape |f32[16,4]| at ShapeIndex {}:
 value: <11 w.1 @0> (size=256,offset=0): f32[16,4]{1,0}
allocation 2: size 16, output shape is |f32[4]|, maybe-live-out:
 value: <13 tanh_reduce_fusion @0> (size=16,offset=0): f32[4]{0}
allocation 3: size 4, thread-local:
 value: <2 reduce_sum.5 @0> (size=4,offset=0): f32[]
allocation 4: size 4, thread-local:
 value: <0 reduce_sum.3 @0> (size=4,offset=0): f32[]
allocation 5: size 4, thread-local:
 value: <1 reduce_sum.4 @0> (size=4,offset=0): f32[]
allocation 6: size 128, preallocated-temp:
 value: <12 ynn_fusion @0> (size=128,offset=0): f32[8,4]{1,0}
"""

# A temp allocation two tuple elements share, a constant in memory color 1,
# and the total XLA prints before its per-value listing.
_SHARED = """\
BufferAssignment:
allocation 0: size 64, maybe-live-out:
 value: <3 while.2{1} @0> (size=32,offset=0): f32[8]{0}
 value: <4 add.5 @0> (size=32,offset=32): f32[8]{0}
allocation 1: size 8, constant, color 1:
 value: <5 constant.1 @0> (size=8,offset=0): f32[2]{0}
allocation 2: size 96:
 value: <6 fusion.3{0,2} @0> (size=96,offset=0): f32[24]{0}

Total bytes used: 168 (168B)

Used values:
<3 while.2{1} @0>
"""


def test_each_allocation_has_its_kind_size_and_values():
  ba = xla_reports.parse_buffer_assignment(_CPU_ASSIGNMENT)
  kinds = [(a.index, a.kind, a.size, a.parameter_number) for a in ba.allocations]
  assert kinds == [(0, "parameter", 512, 0), (1, "parameter", 256, 1), (2, "output", 16, None),
                   (3, "thread-local", 4, None), (4, "thread-local", 4, None),
                   (5, "thread-local", 4, None), (6, "preallocated-temp", 128, None)]
  out = ba.allocations[2]
  assert out.is_output and out.maybe_live_out and not out.is_thread_local
  (v,) = ba.allocations[6].values
  assert (v.id, v.instruction, v.shape_index, v.size, v.offset, v.shape) == (
      12, "ynn_fusion", (), 128, 0, "f32[8,4]{1,0}")
  # XLA's peak leaves the thread-local scratch out.
  assert ba.allocated_bytes() == 512 + 256 + 16 + 128
  assert dict(ba.bytes_by_kind()) == {"parameter": 768, "output": 16, "thread-local": 12,
                                      "preallocated-temp": 128}
  assert ba.total_bytes is None


def test_tuple_elements_colors_constants_and_the_total():
  ba = xla_reports.parse_buffer_assignment(_SHARED)
  shared, constant, temp = ba.allocations
  assert [(v.instruction, v.shape_index, v.offset) for v in shared.values] == [
      ("while.2", (1,), 0), ("add.5", (), 32)]
  assert (shared.kind, shared.is_output) == ("output", False)
  assert (constant.kind, constant.color, constant.is_constant) == ("constant", 1, True)
  assert (temp.kind, temp.values[0].shape_index) == ("temp", (0, 2))
  assert ba.total_bytes == 168
  # The listing after the total repeats values: none is read twice.
  assert sum(len(a.values) for a in ba.allocations) == 4
  holder = ba.allocation_of()
  assert holder[("while.2", (1,))] is shared and holder[("add.5", ())] is shared
  assert holder[("fusion.3", (0, 2))] is temp and ("while.2", ()) not in holder


@pytest.mark.parametrize("text, line, message", [
    ("HloModule m\n", 1, "not an XLA buffer assignment report"),
    ("", 1, "not an XLA buffer assignment report"),
    ("BufferAssignment:\n value: <1 x @0> (size=4,offset=0): f32[]\n", 2,
     "malformed buffer assignment value"),
    ("BufferAssignment:\nallocation 0: size 4:\n value: <x @0>\n", 3,
     "malformed buffer assignment value"),
])
def test_what_is_not_a_buffer_assignment_is_refused_at_its_line(text, line, message):
  with pytest.raises(HloParseError, match=message) as e:
    xla_reports.parse_buffer_assignment(text, source="r.txt")
  assert e.value.line == line and "r.txt" in str(e.value)


def test_a_header_without_allocations_is_an_empty_assignment():
  ba = xla_reports.parse_buffer_assignment("BufferAssignment:\n")
  assert ba.allocations == () and ba.allocated_bytes() == 0


def test_allocations_without_the_header_line_are_still_read():
  body = _CPU_ASSIGNMENT.split("\n", 1)[1]  # as a log quotes it, header cut
  assert len(xla_reports.parse_buffer_assignment(body).allocations) == 7


_CPU_LIVE_RANGE = """\
HloLiveRange (max 4):
  InstructionSequence:
    0:x.1
    1:w.1
    2:ynn_fusion
    3:tanh_reduce_fusion
  BufferLiveRange:
    x.1{}:0-4
    w.1{}:0-4
    ynn_fusion{}:2-3
    tanh_reduce_fusion{}:3-4
  Live ranges at 3 (peak):
    x.1{}: 512 bytes (cumulative: 512 bytes)
    w.1{}: 256 bytes (cumulative: 768 bytes)
    ynn_fusion{}: 128 bytes (cumulative: 896 bytes)
    tanh_reduce_fusion{}: 16 bytes (cumulative: 912 bytes)
  Stack trace breakdown for peak usage: 912 bytes
    main.2 (100.0%, total: 912 bytes, current: 0 bytes, remaining: 912 bytes)
      ├── x (56.1%, total: 512 bytes, current: 512 bytes, remaining: 400 bytes)
"""


def test_the_live_ranges_the_schedule_and_the_peak():
  lr = xla_reports.parse_live_range(_CPU_LIVE_RANGE)
  assert lr.sequence == ("x.1", "w.1", "ynn_fusion", "tanh_reduce_fusion")
  assert dict(lr.ranges) == {("x.1", ()): (0, 4), ("w.1", ()): (0, 4),
                             ("ynn_fusion", ()): (2, 3), ("tanh_reduce_fusion", ()): (3, 4)}
  assert lr.peak_time == 3
  assert lr.peak_values[2] == ("ynn_fusion", (), 128)
  assert lr.peak_bytes == 912


def test_tuple_indices_and_negative_starts_in_live_ranges():
  text = ("HloLiveRange (max 2):\n  InstructionSequence:\n    0:p\n    1:t\n"
          "  BufferLiveRange:\n    p{}:-1-2\n    t{0,1}:1-2\n"
          "  Live ranges at 1 (peak):\n    t{0,1}: 8 bytes (cumulative: 8 bytes)\n")
  lr = xla_reports.parse_live_range(text)
  assert dict(lr.ranges) == {("p", ()): (-1, 2), ("t", (0, 1)): (1, 2)}
  assert lr.peak_values == (("t", (0, 1), 8),) and lr.peak_bytes == 8


@pytest.mark.parametrize("text", ["", "BufferAssignment:\n", "  HloLiveRange (max 1):\n"])
def test_what_is_not_a_live_range_report_is_refused(text):
  with pytest.raises(HloParseError, match="not an XLA live-range report") as e:
    xla_reports.parse_live_range(text)
  assert e.value.line == 1
