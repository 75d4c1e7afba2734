"""Live ranges over the flattened schedule, and the peak memory they imply.

Live ranges follow XLA's `HloLiveRange`: a value lives from its definition
(a computation's parameters from the computation's start) to its last use;
values reaching a computation's root live to the end of its span; read-only
entry parameters live to the end of the run.

Peak memory follows XLA's accounting, so that it can be held against the
numbers XLA reports (`memory_analysis()`, the buffer-assignment report):

1. Allocations, as XLA's BufferAssigner makes them: buffers largest first;
   entry parameters and constants get read-only allocations; every other
   buffer first tries its operands' allocations, then the smallest existing
   allocation it fits, where "fits" means no live range overlaps, except that
   an output may start the moment an operand it can overwrite dies (XLA's
   `CanShareBuffer`, whose rules differ by backend: buffer_sharing.py).
   Outputs that find none get their own allocation.
2. The heap: temporaries that found no allocation. Its peak is the largest sum
   of temporaries live at one time, an output again taking the memory of an
   operand that dies where it is written.

`peak_bytes` = allocations + heap peak. `timeline` gives live bytes per step
for charts: allocations (which the runtime holds for the whole run) plus the
heap at that step.
"""

from __future__ import annotations

import bisect
import dataclasses
import types
from collections.abc import Mapping

from hlo_audit._src.analysis.buffer_sharing import HeapModel, heap_model
from hlo_audit._src.analysis.heap_packing import HeapValue, pack_heap
from hlo_audit._src.analysis.dataflow import Dataflow, ValueId
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.analysis.tuple_tables import tuple_tables
from hlo_audit._src.hlo.ir import Computation, HloModule


@dataclasses.dataclass(frozen=True, slots=True)
class Liveness:
  """Live ranges and peak memory of one module."""

  #: value -> (first, last) time it is live, inclusive (XLA's live ranges).
  value_ranges: Mapping[ValueId, tuple[int, int]]
  #: buffer -> (first, last): the union of its values' ranges.
  ranges: Mapping[ValueId, tuple[int, int]]
  #: buffer -> bytes.
  sizes: Mapping[ValueId, int]
  #: Buffers of read-only entry parameters, and of the entry's result.
  parameter_buffers: frozenset[ValueId]
  output_buffers: frozenset[ValueId]
  #: buffer -> index of the allocation it was placed in (absent: the heap).
  allocation_of: Mapping[ValueId, int]
  #: Sizes of the allocations, by index.
  allocation_sizes: tuple[int, ...]
  #: Temporaries on the heap.
  heap_buffers: frozenset[ValueId]
  #: heap buffer -> heap buffer whose memory it takes over in place.
  heap_reuses: Mapping[ValueId, ValueId]
  #: Live bytes at each time (allocations + heap).
  timeline: tuple[int, ...]
  peak_bytes: int
  #: Time of the heap's peak.
  peak_time: int
  peak_heap_bytes: int
  #: Buffers live at `peak_time` (allocation and heap buffers alike).
  live_at_peak: tuple[ValueId, ...]
  #: Bytes the heap's packing adds to the most bytes live at once (XLA:GPU
  #: packs its temporaries, and the tuples' pointer tables, by best fit:
  #: heap_packing.py, tuple_tables.py); 0 where the heap is the most bytes
  #: live at once. `peak_heap_bytes` includes it.
  fragmentation_bytes: int = 0

  @property
  def allocation_bytes(self) -> int:
    return sum(self.allocation_sizes)

  @property
  def argument_bytes(self) -> int:
    return sum(self.sizes[b] for b in self.parameter_buffers)


@dataclasses.dataclass(frozen=True, slots=True)
class LivenessEdits:
  """Changes a what-if replay makes to the program's buffers (see what_if)."""

  #: Buffers that no longer exist (fused away, dropped).
  dropped: frozenset[ValueId] = frozenset()
  #: value -> (first, last) replacing its live range (a remat shortens one,
  #: a fusion lengthens its inputs').
  value_ranges: Mapping[ValueId, tuple[int, int]] = dataclasses.field(
      default_factory=lambda: types.MappingProxyType({}))
  #: Extra temporaries on the heap, (first, last, bytes): recomputed values.
  extra: tuple[tuple[int, int, int], ...] = ()


def analyze_liveness(module: HloModule, schedule: Schedule,
                     dataflow: Dataflow, edits: LivenessEdits | None = None,
                     cache: dict | None = None, *, platform: str = "") -> Liveness:
  """Live ranges of `dataflow`'s values and buffers, and the peak memory;
  with `edits`, of the program those edits describe. `cache`: a dict kept
  between runs on the same module, schedule and dataflow (what-if replays),
  where the tables no edit changes are made once. `platform`: the backend
  that compiled the module ("gpu", "cpu", ""), whose buffer-sharing rules
  apply."""
  tables = cache.get("liveness_tables") if cache is not None else None
  if tables is None or not tables.serves(module, schedule, dataflow):
    base = tables if tables is not None and tables.extends_to(
        module, schedule, dataflow) else None
    tables = _Tables(module, schedule, dataflow, base, heap_model(platform))
    if cache is not None and base is None:
      cache["liveness_tables"] = tables
  end = schedule.end
  comps = tables.comps
  value_ranges = tables.value_ranges
  parameter_buffers = tables.parameter_buffers
  output_buffers = tables.output_buffers
  sizes = tables.sizes
  order = tables.order
  if edits is not None:
    value_ranges = dict(value_ranges)
    for vid, r in edits.value_ranges.items():
      value_ranges[vid] = tuple(r)
    if edits.dropped:
      dataflow = dataclasses.replace(dataflow, buffers=types.MappingProxyType(
          {b: m for b, m in dataflow.buffers.items() if b not in edits.dropped}))
      parameter_buffers = parameter_buffers - edits.dropped
      output_buffers = output_buffers - edits.dropped
      sizes = {b: sizes[b] for b in dataflow.buffers}
      order = [b for b in order if b not in edits.dropped]

  ranges = {}
  for b, members in dataflow.buffers.items():
    if len(members) == 1:  # most buffers hold one value
      ranges[b] = value_ranges[members[0]]
    else:
      ranges[b] = (min(value_ranges[v][0] for v in members),
                   max(value_ranges[v][1] for v in members))

  sharer = tables.sharer
  allocation_of, allocation_sizes, heap = _assign(
      dataflow, order, comps, sizes, value_ranges, parameter_buffers,
      output_buffers, sharer)
  model = tables.model
  heap_reuses = _heap_reuses(dataflow, schedule, comps, heap, ranges, sizes, sharer,
                             strict=model.strict_operand_sharing)

  # Heap occupancy over time, buffers that take over another's memory merged.
  merged: dict[ValueId, list[int]] = {}
  for b in heap:
    root = b
    while root in heap_reuses:
      root = heap_reuses[root]
    m = merged.setdefault(root, [ranges[b][0], ranges[b][1], sizes[b]])
    m[0] = min(m[0], ranges[b][0])
    m[1] = max(m[1], ranges[b][1])
    m[2] = max(m[2], sizes[b])
  intervals = list(merged.values())
  if edits is not None:
    intervals.extend(edits.extra)
  heap_line = _timeline(intervals, end)
  live_heap = max(heap_line, default=0)
  peak_time = heap_line.index(live_heap) if heap_line else 0
  peak_heap = live_heap
  if model.packing_alignment is not None:
    peak_heap = max(live_heap, _packed_heap(
        dataflow, comps, heap, value_ranges, sizes, sharer, model.packing_alignment,
        edits.extra if edits is not None else (), tables.tuple_tables()))
  fixed = sum(allocation_sizes)
  live_at_peak = tuple(b for b, (s, e) in ranges.items() if s <= peak_time <= e)
  return Liveness(
      value_ranges=types.MappingProxyType(value_ranges),
      ranges=types.MappingProxyType(ranges),
      sizes=types.MappingProxyType(sizes),
      parameter_buffers=frozenset(parameter_buffers),
      output_buffers=frozenset(output_buffers),
      allocation_of=types.MappingProxyType(allocation_of),
      allocation_sizes=tuple(allocation_sizes),
      heap_buffers=frozenset(heap),
      heap_reuses=types.MappingProxyType(heap_reuses),
      timeline=tuple(fixed + x for x in heap_line),
      peak_bytes=fixed + peak_heap, peak_time=peak_time,
      peak_heap_bytes=peak_heap, live_at_peak=live_at_peak,
      fragmentation_bytes=peak_heap - live_heap)


def _packed_heap(dataflow, comps, heap, value_ranges, sizes, sharer, alignment,
                 extra, tables) -> int:
  """The heap's size as XLA's best-fit packing of its values makes it, with
  the tuple values' pointer tables."""
  in_heap = set(heap)
  values = [HeapValue(v, *value_ranges[v], sizes[b], b)
            for v, b in dataflow.buffer_of.items() if b in in_heap]
  values += [HeapValue(("<recomputed>", (i,)), s, e, size, ("<recomputed>", (i,)))
             for i, (s, e, size) in enumerate(extra)]
  values += [HeapValue(("<table>",) + t.value, t.start, t.end, t.size, ("<table>",) + t.buffer)
             for t in tables]

  def operands(v):
    value = dataflow.values.get(v)
    if value is None:
      return ()
    inst = comps[value.computation].instruction(v[0])
    # XLA shares only with values the user's direct operands define.
    return [ov for o in dict.fromkeys(inst.operands) for _, ov in dataflow.holds.get(o, ())
            if ov[0] == o]

  return pack_heap(values, alignment=alignment, operands=operands,
                   may_overwrite=sharer.can_follow)


class _Tables:
  """What analyze_liveness derives from the program alone, before any edit:
  XLA's live ranges, the read-only and output buffers, sizes, the
  assigner's order and the sharer (what-if replays reuse them)."""

  __slots__ = ("module", "schedule", "dataflow", "comps", "value_ranges",
               "parameter_buffers", "output_buffers", "sizes", "order", "sharer",
               "position", "unextended", "model", "use_time", "_tables")

  def __init__(self, module: HloModule, schedule: Schedule, dataflow: Dataflow,
               base: _Tables | None = None, model: HeapModel | None = None):
    """`base`: tables this program only adds input/output aliases to (see
    `extends_to`); what aliases leave alone is taken from it."""
    self.module, self.schedule, self.dataflow = module, schedule, dataflow
    end = schedule.end
    span = schedule.span
    entry = module.entry
    comps = {name: module.computation(name) for name in span}
    if base is None:
      time = schedule.time
      ranges: dict[ValueId, list[int]] = {}
      use_time = self.use_time = _use_times(comps, time, span)
      for vid, value in dataflow.values.items():
        inst = comps[value.computation].instruction(vid[0])
        t = time[vid[0]]
        start = span[value.computation][0] if inst.opcode == "parameter" else t
        last = t
        for user, _ in dataflow.uses.get(vid, ()):
          ut = use_time.get(user, -1)
          if ut > last:
            last = ut
        ranges[vid] = [start, last]
      for comp_name, comp in comps.items():
        for _, vid in dataflow.holds.get(comp.root_name, ()):
          if vid in ranges:
            ranges[vid][1] = max(ranges[vid][1], span[comp_name][1])
      value_ranges = {v: tuple(r) for v, r in ranges.items()}
    else:
      self.use_time = base.use_time
      # The same values and uses: only the read-only parameters' extension
      # to the end depends on the aliases.
      value_ranges = dict(base.value_ranges)
      value_ranges.update(base.unextended)
    donated = {(a.parameter, a.parameter_index) for a in module.input_output_alias}
    parameter_buffers = set()
    unextended = {}
    for p in entry.parameters:
      for index, vid in dataflow.holds.get(p.name, ()):
        if vid[0] == p.name and (p.parameter_number, index) not in donated:
          unextended[vid] = value_ranges[vid]
          value_ranges[vid] = (value_ranges[vid][0], end)
          parameter_buffers.add(dataflow.buffer_of[vid])
    self.comps = comps
    self.value_ranges = value_ranges
    self.unextended = unextended
    self.parameter_buffers = frozenset(parameter_buffers)
    self.output_buffers = frozenset(dataflow.buffer_of[vid]
                                    for _, vid in dataflow.holds.get(entry.root_name, ()))
    values = dataflow.values
    self.sizes = {b: (values[members[0]].byte_size if len(members) == 1 else
                      max(values[v].byte_size for v in members))
                  for b, members in dataflow.buffers.items()}
    # XLA's order: largest first, live-out first, then the earliest defining
    # instruction in post order (entry first). Models with many equal-sized
    # buffers depend on this tie-break.
    position, comp_rank = self.position = (_post_order_positions(comps) if base is None
                                           else base.position)
    sizes, outputs, buffers, values = (self.sizes, self.output_buffers, dataflow.buffers,
                                       dataflow.values)

    def first(b):
      members = buffers[b]
      if len(members) == 1:
        return position.get(members[0][0], 0)
      return min(position.get(v[0], 0) for v in members)

    def buffer_id(b):
      # XLA's HloBuffer ids follow their first value's id: values are made
      # callees first, in each computation's post order, index by index.
      return min((comp_rank.get(values[v].computation, 0), position.get(v[0], 0), v[1])
                 for v in buffers[b])

    self.order = sorted(buffers, key=lambda b: (-sizes[b], b not in outputs, first(b),
                                                buffer_id(b)))
    # The sharer reads values, holds and computations only.
    self.model = (model or heap_model("")) if base is None else base.model
    self._tables = None if base is None else base._tables
    self.sharer = (_Sharer(module, comps, dataflow, self.model.can_share)
                   if base is None else base.sharer)

  def tuple_tables(self) -> list:
    """The tuple values' pointer tables on the heap (tuple_tables.py)."""
    if self._tables is None:
      self._tables = tuple_tables(self.module, self.schedule, self.comps, self.use_time)
    return self._tables

  def serves(self, module: HloModule, schedule: Schedule, dataflow: Dataflow) -> bool:
    return (self.module is module and self.schedule is schedule and
            self.dataflow is dataflow)

  def extends_to(self, module: HloModule, schedule: Schedule, dataflow: Dataflow) -> bool:
    """Whether the program differs from these tables' only by input/output
    aliases (a donation what-if: `with_donation`, `with_output_aliases`):
    the same computations, schedule, values, holds and uses."""
    return (self.schedule is schedule and
            self.module.computations is module.computations and
            self.dataflow.values is dataflow.values and
            self.dataflow.holds is dataflow.holds and
            self.dataflow.uses is dataflow.uses)


def _use_times(comps: Mapping[str, Computation], time: Mapping[str, int],
               span: Mapping[str, tuple[int, int]]) -> dict[str, int]:
  """instruction -> the time its reading an operand's value counts, after
  XLA's `HloValue` uses and `HloLiveRange`: a tuple or get-tuple-element
  reads no array (only pointers: the forwarded value's readers count), and
  a while's operands are done with when the loop starts (XLA's live-range
  reports end them at the condition's parameter, the loop's first step)."""
  out = {}
  for comp in comps.values():
    for inst in comp.instructions:
      t = time.get(inst.name)
      if t is None or inst.opcode in ("tuple", "get-tuple-element", "domain"):
        continue
      if inst.opcode == "while":
        loop = [span[c][0] for c in inst.called_computation_names() if c in span]
        if loop:
          t = min(loop)
      out[inst.name] = t
  return out


class _Sharer:
  """Answers XLA's "may this value start where that one ends?" question."""

  def __init__(self, module, comps, dataflow, rule):
    self.module = module
    self.comps = comps
    self.dataflow = dataflow
    self.rule = rule
    self._holders: dict[ValueId, list[str]] = {}
    for inst, pairs in dataflow.holds.items():
      for _, vid in pairs:
        self._holders.setdefault(vid, []).append(inst)
    self._cache: dict = {}

  def can_follow(self, operand: ValueId, user: ValueId) -> bool:
    """Whether value `user` may take `operand`'s memory when `operand`'s live
    range ends exactly where `user`'s starts (LiveRangeInterferes)."""
    key = (operand, user)
    hit = self._cache.get(key)
    if hit is not None:
      return hit
    result = False
    user_value = self.dataflow.values[user]
    comp = self.comps[user_value.computation]
    user_inst = comp.instruction(user[0])
    if user_inst.opcode != "copy" and user_inst.opcode not in ("parameter", "constant"):
      holders = set(self._holders.get(operand, ()))
      for k, o in enumerate(user_inst.operands):
        if o in holders:
          held = [idx for idx, v in self.dataflow.holds.get(o, ()) if v == operand]
          if any(self.rule(self.module, comp, user_inst, k, idx, user[1]) for idx in held):
            result = True
            break
    self._cache[key] = result
    return result


def _interferes(a: tuple[int, int], a_id: ValueId, b: tuple[int, int],
                b_id: ValueId, sharer: _Sharer) -> bool:
  if a[0] > b[1] or b[0] > a[1]:
    return False
  if a[1] == b[0]:
    return not sharer.can_follow(a_id, b_id)
  if b[1] == a[0]:
    return not sharer.can_follow(b_id, a_id)
  return True


class _Allocation:
  """One allocation: its size and the values in it, sorted by start."""

  __slots__ = ("size", "readonly", "starts", "spans", "reach")

  def __init__(self, size: int, readonly: bool):
    self.size = size
    self.readonly = readonly
    self.starts: list[int] = []
    self.spans: list[tuple[int, int, ValueId]] = []
    # reach[j]: the furthest end among spans[:j + 1]. A buffer's own values
    # may overlap (loop state), so a span can hide behind later ones.
    self.reach: list[int] = []

  def fits(self, values, sharer: _Sharer) -> bool:
    for start, last, vid in values:
      # Only spans starting at or before `last` can overlap, and of those
      # only the ones reaching `start`.
      j = bisect.bisect_right(self.starts, last) - 1
      reach = self.reach
      while j >= 0 and reach[j] >= start:
        s, e, other = self.spans[j]
        if e >= start and _interferes((start, last), vid, (s, e), other, sharer):
          return False
        j -= 1
    return True

  def add(self, values) -> None:
    reach = self.reach
    for start, last, vid in values:
      i = bisect.bisect_right(self.starts, start)
      self.starts.insert(i, start)
      self.spans.insert(i, (start, last, vid))
      r = max(last, reach[i - 1]) if i else last
      reach.insert(i, r)
      k = i + 1
      while k < len(reach) and reach[k] < r:
        reach[k] = r
        k += 1


class _Occupancy:
  """Which reusable allocations hold a value at each time, to skip the ones
  a buffer cannot fit without trying them.

  A segment tree over doubled time: a span [s, e] of allocation i sets bit i
  on the points 2s..2e, and a value [s, e] can only fit allocations with no
  bit set on 2s+1..2e-1. That is exactly "no span overlaps it other than at
  an end" (what `_interferes` rejects without asking the sharer); touching
  ends are left to `_Allocation.fits`. Each node keeps `cover`, the
  allocations occupying all of it, and `any`, those occupying some point
  under it; updates and queries OR O(log T) integers used as bit sets. With
  it a buffer that fits nowhere (it goes to the heap) costs one query, not a
  try of every allocation, which was quadratic on modules whose outputs are
  written late (the gradients of a train step: ~9M tries on a 42k-instruction
  module).
  """

  __slots__ = ("size", "cover", "any")

  def __init__(self, end: int):
    size = 1
    while size < 2 * end + 2:
      size *= 2
    self.size = size
    self.cover = [0] * (2 * size)
    self.any = [0] * (2 * size)

  def add(self, values, i: int) -> None:
    bit = 1 << i
    cover, any_ = self.cover, self.any
    for start, last, _ in values:
      lo = 2 * max(start, 0) + self.size
      hi = 2 * last + self.size + 1
      if lo >= hi:
        continue
      # Every node on the paths from the ends to the root holds a point of
      # the span (and a node holding the bit has ancestors holding it).
      for leaf in (lo, hi - 1):
        node = leaf >> 1
        while node and not any_[node] & bit:
          any_[node] |= bit
          node >>= 1
      l, r = lo, hi
      while l < r:
        if l & 1:
          cover[l] |= bit
          any_[l] |= bit
          l += 1
        if r & 1:
          r -= 1
          cover[r] |= bit
          any_[r] |= bit
        l >>= 1
        r >>= 1

  def busy(self, values) -> int:
    """The allocations (bits) some value overlaps other than at an end."""
    out = 0
    cover, any_ = self.cover, self.any
    for start, last, _ in values:
      lo = 2 * max(start, 0) + 1 + self.size
      hi = 2 * last - 1 + self.size + 1
      if lo >= hi:
        continue
      l, r = lo, hi
      while l < r:
        if l & 1:
          out |= any_[l]
          l += 1
        if r & 1:
          r -= 1
          out |= any_[r]
        l >>= 1
        r >>= 1
      # Nodes above the ones read that a span covers whole: the two ends'
      # paths to the root, shared above where they meet.
      a, b = lo >> 1, (hi - 1) >> 1
      while a != b:
        out |= cover[a] | cover[b]
        a >>= 1
        b >>= 1
      while a:
        out |= cover[a]
        a >>= 1
    return out


def _assign(dataflow, order, comps, sizes, value_ranges, parameter_buffers,
            output_buffers, sharer):
  """XLA's BufferAssigner over our buffers, in `order` (`_Tables.order`);
  returns (allocation of each placed buffer, allocation sizes, heap
  buffers)."""
  allocations: list[_Allocation] = []
  program_end = max((r[1] for r in value_ranges.values()), default=0)
  occupancy = _Occupancy(program_end)
  reusable = 0  # bits of the allocations a temporary may join
  allocation_of: dict[ValueId, int] = {}
  heap: list[ValueId] = []
  for b in order:
    members = dataflow.buffers[b]
    values = [(value_ranges[v][0], value_ranges[v][1], v) for v in members]
    size = sizes[b]
    first = dataflow.values[b]
    inst = comps[first.computation].instruction(first.instruction)
    if inst.opcode == "constant" or b in parameter_buffers:
      allocations.append(_Allocation(size, readonly=True))
      allocations[-1].add(values)
      allocation_of[b] = len(allocations) - 1
      continue
    live_out = b in output_buffers
    busy = occupancy.busy(values)

    def try_place(i: int) -> bool:
      alloc = allocations[i]
      if alloc.readonly or alloc.size < size or (live_out and alloc.size != size):
        return False
      if busy >> i & 1 or not alloc.fits(values, sharer):
        return False
      alloc.add(values)
      allocation_of[b] = i
      occupancy.add(values, i)
      return True

    placed = False
    # Operands' allocations first (top-level values only), for locality.
    for v in members:
      if v[1] != () or placed:
        continue
      user = comps[dataflow.values[v].computation].instruction(v[0])
      for operand in user.operands:
        for idx, ov in dataflow.holds.get(operand, ()):
          if idx != ():
            continue
          i = allocation_of.get(dataflow.buffer_of[ov])
          if i is not None and try_place(i):
            placed = True
            break
        if placed:
          break
    if not placed:
      # Reusable allocations newest first (XLA's order), skipping those a
      # value overlaps other than at an end (they cannot fit).
      free = reusable & ~busy
      while free and not placed:
        i = free.bit_length() - 1
        free ^= 1 << i
        placed = try_place(i)
    if placed:
      continue
    if not live_out:
      heap.append(b)
      continue
    allocations.append(_Allocation(size, readonly=False))
    allocations[-1].add(values)
    allocation_of[b] = len(allocations) - 1
    reusable |= 1 << (len(allocations) - 1)
    occupancy.add(values, len(allocations) - 1)
  return allocation_of, [a.size for a in allocations], heap


def _post_order_positions(comps: Mapping[str, Computation]
                          ) -> tuple[dict[str, int], dict[str, int]]:
  """Instruction -> position in the order BufferAssigner sorts by: callers
  before callees (the reverse of a callee-first walk of the call graph) and,
  inside each computation, a depth-first post order from the instructions
  without users, control predecessors (last first) then operands (first to
  last) (`MakeInstructionPostOrder`); and computation -> rank in a
  callee-first walk (the order XLA makes values in)."""
  callee_first: list[str] = []
  seen: set[str] = set()
  for top in comps:
    stack = [(top, iter(comps[top].instructions))] if top not in seen else []
    seen.add(top)
    while stack:
      name, it = stack[-1]
      inst = next(it, None)
      if inst is None:
        stack.pop()
        callee_first.append(name)
        continue
      for callee in inst.called_computation_names():
        if callee in comps and callee not in seen:
          seen.add(callee)
          stack.append((callee, iter(comps[callee].instructions)))
  position: dict[str, int] = {}
  for name in reversed(callee_first):
    comp = comps[name]
    used = {o for inst in comp.instructions for o in inst.operands}
    visiting: set[str] = set()
    for start in comp.instructions:
      if start.name in used or start.name in position:
        continue
      stack = [start.name]
      while stack:
        cur = stack[-1]
        if cur in position:
          stack.pop()
        elif cur in visiting:
          stack.pop()
          position[cur] = len(position)
        else:
          visiting.add(cur)
          inst = comp.instruction(cur)
          stack.extend(o for o in reversed(inst.operands) if o not in position)
          # Pushed last, so visited first (XLA's stack order).
          stack.extend(o for o in inst.control_predecessors
                       if o not in position and o in comp)
  return position, {name: i for i, name in enumerate(callee_first)}


def _heap_reuses(dataflow, schedule, comps, heap, ranges, sizes, sharer, *,
                 strict: bool = False):
  """Heap buffers that take over a dying operand's heap memory in place (the
  heap simulator's ShareWith): buffer -> the buffer whose memory it takes.
  `strict`: as XLA's heap simulator has it, only between buffers of one
  value each, whatever their sizes."""
  in_heap = set(heap)
  reuses: dict[ValueId, ValueId] = {}
  taken: set[ValueId] = set()
  for b in sorted(heap, key=lambda b: ranges[b][0]):
    start = ranges[b][0]
    for v in dataflow.buffers[b]:
      if start != schedule.time.get(v[0]):
        continue
      user = comps[dataflow.values[v].computation].instruction(v[0])
      for operand in user.operands:
        for idx, ov in dataflow.holds.get(operand, ()):
          ob = dataflow.buffer_of[ov]
          if ob not in in_heap or strict and (
              len(dataflow.buffers[b]) != 1 or len(dataflow.buffers[ob]) != 1
              or ov[0] != operand):  # XLA: a value its direct operand defines
            continue
          if (ob not in taken and ob != b and
              ranges[ob][1] == start and (strict or sizes[ob] >= sizes[b]) and
              sharer.can_follow(ov, v)):
            reuses[b] = ob
            taken.add(ob)
            break
        if b in reuses:
          break
      if b in reuses:
        break
  return reuses


def _timeline(intervals, end: int) -> list[int]:
  delta = [0] * (end + 2)
  for start, last, size in intervals:
    delta[max(start, 0)] += size
    delta[min(last, end) + 1] -= size
  out = []
  cur = 0
  for t in range(end):
    cur += delta[t]
    out.append(cur)
  return out
