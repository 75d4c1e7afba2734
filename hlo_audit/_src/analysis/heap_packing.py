"""Where XLA places temporaries in one heap, and how large that heap is.

XLA:GPU puts every temporary that found no allocation of its own into one
"preallocated temp" allocation, packed by XLA's heap simulator: events in
schedule order (`HeapSimulator::RunComputation`: at each step, the values
defined there are allocated, or colocated with a dying operand they may
overwrite or with the other values of their buffer, then the values that die
there are freed), then `GlobalDecreasingSizeBestFitHeap` places each group
of colocated values, in a fixed order, at the best-fitting gap of the
offsets free during its lifetime (`kSpatial`: largest first; `kTemporal`:
longest-lived first), and XLA keeps the smaller of the two heaps. Chunk ends
are rounded up to the alignment. The heap is then larger than the most bytes
ever live at once by the fragmentation this leaves.

XLA:TPU places its HBM heap's groups in the order they are allocated
instead, and only in that order (`PackingOrder.DEFINITION`).

`pack_heap` replays that on the audit's values; the result is the size of
XLA's temp allocation.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence

import numpy as np

#: A value of the heap: (defining instruction, shape index).
Value = tuple[str, tuple[int, ...]]


class PackingOrder(enum.Enum):
  """The order best fit places a heap's groups of colocated values in."""

  #: Largest first, then longest-lived (GlobalDecreasingSizeBestFitHeap's kSpatial).
  SPATIAL = "spatial"
  #: Longest-lived first, then largest (kTemporal).
  TEMPORAL = "temporal"
  #: In the order the heap simulator allocates them: schedule order.
  #: XLA:TPU's HBM heap, read off its buffer-assignment dumps: at batch 32
  #: the suite's example (libtpu 0.0.42.1, v5e) has every temporary at the
  #: offset best fit gives it in the order the values are defined (its two
  #: 128 MiB attention buffers 151 MiB apart, where largest first would put
  #: them at 0 and 128 MiB): a heap of 329.5 MB, where either decreasing
  #: order packs 304 MB, so XLA:TPU runs neither beside it.
  DEFINITION = "definition"


#: XLA's own heap simulator (XLA:GPU): the smaller of the two decreasing orders.
DECREASING_ORDERS = (PackingOrder.SPATIAL, PackingOrder.TEMPORAL)


@dataclasses.dataclass(frozen=True, slots=True)
class HeapValue:
  """One value to place: its live steps, and what it may share."""

  value: Value
  #: First and last step it is live (inclusive).
  start: int
  end: int
  #: Its buffer's size (every value of a buffer gets the buffer's chunk).
  size: int
  #: The buffer it belongs to (values of one buffer share one chunk).
  buffer: Value


def pack_heap(values: Sequence[HeapValue], *, alignment: int,
              operands: Callable[[Value], Sequence[Value]],
              may_overwrite: Callable[[Value, Value], bool],
              orders: Sequence[PackingOrder] = DECREASING_ORDERS) -> int:
  """The size of the heap XLA's best-fit packing makes for `values`: the
  smallest of the heaps best fit makes in each of `orders`.

  Args:
    values: every value of the heap's buffers, in XLA's value order.
    alignment: chunk alignment in bytes.
    operands: the values the instruction defining a value reads.
    may_overwrite: (operand value, user value) -> whether the user may take
      the operand's memory when the operand dies where the user is written.
  """
  if not values:
    return 0
  intervals, groups = _events(values, operands, may_overwrite)
  return min(_best_fit(intervals, groups, alignment, order) for order in orders)


@dataclasses.dataclass(slots=True)
class _Interval:
  order: int
  size: int
  start: int  # event counters, as GlobalDecreasingSizeBestFitHeap has them
  end: int
  #: Whether it gets a chunk of its own (else it is colocated with another).
  allocates: bool


def _events(values: Sequence[HeapValue], operands, may_overwrite):
  """XLA's RunComputation: Alloc, ShareWith and Free events -> intervals
  and, per allocating interval, the intervals colocated with it."""
  by_value = {v.value: v for v in values}
  members: dict[Value, int] = {}
  for v in values:
    members[v.buffer] = members.get(v.buffer, 0) + 1
  last = max(v.end for v in values)
  order = {v.value: i for i, v in enumerate(values)}
  ranked = sorted(values, key=lambda v: (v.start, v.end, order[v.value]))
  defined: list[list[HeapValue]] = [[] for _ in range(last + 1)]
  freed: list[list[Value]] = [[] for _ in range(last + 1)]
  end_of: dict[Value, int] = {}
  for v in ranked:
    defined[v.start].append(v)
    freed[v.end].append(v.value)
    end_of[v.value] = v.end
  size = {v.buffer: v.size for v in values}  # a buffer's size, grown by sharing
  intervals: dict[Value, _Interval] = {}
  colocated: dict[Value, list[Value]] = {}
  first_of_buffer: dict[Value, Value] = {}
  clock = 0

  def share(v: Value, with_: Value, grown: int) -> None:
    nonlocal clock
    colocated.setdefault(with_, []).append(v)
    intervals[v] = _Interval(order[v], grown, clock, -1, False)
    clock += 1

  def free(v: Value) -> None:
    nonlocal clock
    intervals[v].end = clock
    clock += 1

  for step in range(last + 1):
    for hv in defined[step]:
      v, buf = hv.value, hv.buffer
      if buf in first_of_buffer:
        share(v, first_of_buffer[buf], size[buf])
        continue
      shared = False
      if members[buf] == 1:
        for ov in operands(v):
          other = by_value.get(ov)
          if other is None or members[other.buffer] != 1 or end_of[ov] != step or \
              ov not in freed[step] or not may_overwrite(ov, v):
            continue
          free(ov)
          freed[step].remove(ov)
          grown = max(size[buf], size[other.buffer])
          size[buf] = size[other.buffer] = grown
          share(v, ov, grown)
          end_of[ov] = hv.end
          shared = True
          break
      if not shared:
        intervals[v] = _Interval(order[v], size[buf], clock, -1, True)
        clock += 1
        first_of_buffer[buf] = v
    for v in freed[step]:
      free(v)
  # Transitive colocations of each allocating interval.
  groups: dict[Value, list[Value]] = {}
  for v, iv in intervals.items():
    if not iv.allocates:
      continue
    seen, stack = [v], [v]
    while stack:
      for c in colocated.get(stack.pop(), ()):
        seen.append(c)
        stack.append(c)
    groups[v] = seen
  return intervals, groups


def _best_fit(intervals: Mapping[Value, _Interval], groups: Mapping[Value, list[Value]],
              alignment: int, order: PackingOrder) -> int:
  """GlobalDecreasingSizeBestFitHeap::Finish for unsliced intervals."""

  def key(v: Value):
    iv = intervals[v]
    if order is PackingOrder.DEFINITION:
      return (iv.start,)  # a group's allocating interval starts before its colocations
    if order is PackingOrder.TEMPORAL:
      span = (min(intervals[c].start for c in groups[v]) -
              max(intervals[c].end for c in groups[v]))
      return (span, -iv.size, iv.order)
    return (-iv.size, iv.start - iv.end, iv.order)

  n = sum(len(g) for g in groups.values())
  starts = np.empty(n, dtype=np.int64)
  ends = np.empty(n, dtype=np.int64)
  offsets = np.empty(n, dtype=np.int64)
  aligned_ends = np.empty(n, dtype=np.int64)
  used = 0
  heap = 0
  for v in sorted(groups, key=key):
    members = groups[v]
    need = max(intervals[c].size for c in members)
    if need == 0:
      continue
    busy = np.zeros(used, dtype=bool)
    for c in members:
      iv = intervals[c]
      busy |= (starts[:used] <= iv.end) & (ends[:used] >= iv.start)
    offset = _best_offset(offsets[:used][busy], aligned_ends[:used][busy], need, alignment)
    for c in members:
      iv = intervals[c]
      starts[used], ends[used] = iv.start, iv.end
      offsets[used] = offset
      aligned_ends[used] = align(offset + need, alignment)
      used += 1
    heap = max(heap, offset + need)
  return heap


def align(x: int, alignment: int) -> int:
  """`x` rounded up to a multiple of `alignment`."""
  return -(-x // alignment) * alignment


def _best_offset(offsets: np.ndarray, ends: np.ndarray, need: int, alignment: int) -> int:
  """The start of the smallest free gap (then the lowest) among the busy
  chunks that holds `need` bytes at an aligned offset; else the end of the
  highest busy chunk."""
  if not len(offsets):
    return 0
  order = np.argsort(offsets, kind="stable")
  best = None  # (gap size, offset)
  cursor = 0
  for i in order:
    lo, hi = int(offsets[i]), int(ends[i])
    if lo > cursor:
      start = align(cursor, alignment)
      if start + need <= lo and (best is None or lo - cursor < best[0]):
        best = (lo - cursor, start)
    cursor = max(cursor, hi)
  return best[1] if best is not None else align(cursor, alignment)
