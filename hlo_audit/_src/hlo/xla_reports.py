"""Parsers for the text reports XLA writes beside a dumped module: buffer
assignment (`*-buffer-assignment.txt`) and live ranges (`*-live-range.txt`).

These are XLA's own answers to "which buffers exist, where they live, and
what is live at the peak"; the audit sets its own liveness beside them.
Formats follow `BufferAllocation::ToString` and `HloLiveRange::ToString`.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Mapping

from hlo_audit._src.errors import HloParseError


@dataclasses.dataclass(frozen=True, slots=True)
class AssignedValue:
  """One HLO value placed in an allocation."""

  #: XLA's value id.
  id: int
  #: Defining instruction.
  instruction: str
  #: Index into the instruction's (tuple) shape; () for arrays.
  shape_index: tuple[int, ...]
  size: int
  offset: int
  #: Shape as printed.
  shape: str


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
  """One buffer allocation of XLA's buffer assignment."""

  index: int
  size: int
  #: Entry parameter number, for parameter allocations.
  parameter_number: int | None = None
  #: Whether the allocation holds (part of) the entry output.
  maybe_live_out: bool = False
  is_output: bool = False
  is_thread_local: bool = False
  is_constant: bool = False
  is_preallocated_temp: bool = False
  #: Memory color (0 = default device memory).
  color: int = 0
  values: tuple[AssignedValue, ...] = ()

  @property
  def kind(self) -> str:
    """"parameter", "output", "constant", "thread-local", "preallocated-temp"
    or "temp"."""
    if self.parameter_number is not None:
      return "parameter"
    if self.is_output or self.maybe_live_out:
      return "output"
    if self.is_constant:
      return "constant"
    if self.is_thread_local:
      return "thread-local"
    if self.is_preallocated_temp:
      return "preallocated-temp"
    return "temp"


@dataclasses.dataclass(frozen=True, slots=True)
class BufferAssignment:
  """XLA's buffer assignment of one module."""

  allocations: tuple[Allocation, ...]
  #: "Total bytes used" as XLA prints it, when present.
  total_bytes: int | None = None

  def allocated_bytes(self) -> int:
    """The bytes of every allocation but thread-local scratch: what "XLA's
    peak" sums (`buffer_assignment_proto.allocated_bytes` reads the same from
    the proto)."""
    return sum(a.size for a in self.allocations if not a.is_thread_local)

  def bytes_by_kind(self) -> Mapping[str, int]:
    out: dict[str, int] = {}
    for a in self.allocations:
      out[a.kind] = out.get(a.kind, 0) + a.size
    return types.MappingProxyType(out)

  def allocation_of(self) -> Mapping[tuple[str, tuple[int, ...]], Allocation]:
    """(instruction, shape index) -> the allocation holding that value."""
    out = {}
    for a in self.allocations:
      for v in a.values:
        out[(v.instruction, v.shape_index)] = a
    return types.MappingProxyType(out)


@dataclasses.dataclass(frozen=True, slots=True)
class LiveRange:
  """XLA's live ranges over its flattened instruction sequence."""

  #: Instruction names in schedule order (positions are indices here).
  sequence: tuple[str, ...]
  #: (instruction, shape index) -> (first, last) position it is live.
  ranges: Mapping[tuple[str, tuple[int, ...]], tuple[int, int]]
  #: Position of the peak, and the values live there with their sizes.
  peak_time: int | None = None
  peak_values: tuple[tuple[str, tuple[int, ...], int], ...] = ()

  @property
  def peak_bytes(self) -> int:
    """Sum of the sizes of the values live at the peak (logical values:
    values sharing one allocation are each counted)."""
    return sum(size for _, _, size in self.peak_values)


_ALLOC = re.compile(r"allocation (\d+): size (\d+)(.*):\s*$")
_VALUE = re.compile(
    r"\s*value: <(\d+) ([^ {>]+)(?:\{([\d,]*)\})?[^>]*> \(size=(\d+),offset=(\d+)\): (.*)$")
_TOTAL = re.compile(r"Total bytes used: (\d+)")
_PARAM = re.compile(r", parameter (\d+)")
_COLOR = re.compile(r", color (\d+)")


def _index(text: str | None) -> tuple[int, ...]:
  return tuple(int(x) for x in text.split(",") if x) if text else ()


def _fail(source: str | None, lineno: int, line: str, message: str):
  raise HloParseError(message, line=lineno, column=1, line_text=line,
                      source=source)


def parse_buffer_assignment(text: str, source: str | None = None) -> BufferAssignment:
  """Parses XLA's `*-buffer-assignment.txt`.

  Raises:
    HloParseError: if the text is not a buffer assignment report.
  """
  allocations: list[Allocation] = []
  current: dict | None = None
  values: list[AssignedValue] = []
  total = None
  seen_header = False
  for lineno, line in enumerate(text.splitlines(), 1):
    if line.startswith("BufferAssignment"):
      seen_header = True
      continue
    m = _ALLOC.match(line)
    if m is not None:
      if current is not None:
        allocations.append(Allocation(values=tuple(values), **current))
      flags = m.group(3)
      p = _PARAM.search(flags)
      c = _COLOR.search(flags)
      current = dict(
          index=int(m.group(1)), size=int(m.group(2)),
          parameter_number=int(p.group(1)) if p else None,
          maybe_live_out="maybe-live-out" in flags,
          is_output="output shape is" in flags,
          is_thread_local="thread-local" in flags,
          is_constant=", constant" in flags,
          is_preallocated_temp="preallocated-temp" in flags,
          color=int(c.group(1)) if c else 0)
      values = []
      continue
    if line.startswith(" value:"):
      v = _VALUE.match(line)
      if v is None or current is None:
        _fail(source, lineno, line, "malformed buffer assignment value")
      values.append(AssignedValue(
          id=int(v.group(1)), instruction=v.group(2),
          shape_index=_index(v.group(3)), size=int(v.group(4)),
          offset=int(v.group(5)), shape=v.group(6).strip()))
      continue
    t = _TOTAL.match(line)
    if t is not None:
      total = int(t.group(1))
      break  # the per-value listing that follows repeats what we have
  if current is not None:
    allocations.append(Allocation(values=tuple(values), **current))
  if not seen_header and not allocations:
    _fail(source, 1, text.splitlines()[0] if text else "",
          "not an XLA buffer assignment report (no 'BufferAssignment:' line)")
  return BufferAssignment(tuple(allocations), total)


_SEQ = re.compile(r"\s*(\d+):(\S+)\s*$")
_RANGE = re.compile(r"\s*([^{\s]+)\{([\d,]*)\}:(-?\d+)-(-?\d+)\s*$")
_PEAK_AT = re.compile(r"\s*Live ranges at (\d+) \(peak\):")
_PEAK_VALUE = re.compile(r"\s*([^{\s]+)\{([\d,]*)\}: (\d+) bytes")


def parse_live_range(text: str, source: str | None = None) -> LiveRange:
  """Parses XLA's `*-live-range.txt`.

  Raises:
    HloParseError: if the text is not a live-range report.
  """
  lines = text.splitlines()
  if not lines or not lines[0].startswith("HloLiveRange"):
    _fail(source, 1, lines[0] if lines else "",
          "not an XLA live-range report (no 'HloLiveRange' header)")
  sequence: list[str] = []
  ranges: dict = {}
  peak_time = None
  peak: list = []
  section = None
  for lineno, line in enumerate(lines[1:], 2):
    stripped = line.strip()
    if stripped == "InstructionSequence:":
      section = "seq"
      continue
    if stripped == "BufferLiveRange:":
      section = "range"
      continue
    m = _PEAK_AT.match(line)
    if m is not None:
      section = "peak"
      peak_time = int(m.group(1))
      continue
    if stripped.startswith("Stack trace breakdown"):
      break
    if section == "seq":
      s = _SEQ.match(line)
      if s is not None:
        sequence.append(s.group(2))
    elif section == "range":
      r = _RANGE.match(line)
      if r is not None:
        ranges[(r.group(1), _index(r.group(2)))] = (int(r.group(3)), int(r.group(4)))
    elif section == "peak":
      v = _PEAK_VALUE.match(line)
      if v is not None:
        peak.append((v.group(1), _index(v.group(2)), int(v.group(3))))
  return LiveRange(tuple(sequence), types.MappingProxyType(ranges), peak_time,
                   tuple(peak))
