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
   Outputs that find none get their own allocation. (XLA:TPU of libtpu
   0.0.50 offers a temporary no output's allocation: `HeapModel`.)
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
import itertools
import types
from collections.abc import Mapping

from hlo_audit._src.analysis.buffer_sharing import HeapModel, heap_model
from hlo_audit._src.analysis.heap_packing import HeapValue, align, pack_heap
from hlo_audit._src.analysis.dataflow import Dataflow, ValueId
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.analysis.tuple_tables import tuple_tables
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction


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
  #: heap_packing.py, tuple_tables.py; XLA:TPU reports its fragmentation
  #: too: tpu_reported_temp); 0 where the heap is the most bytes live at
  #: once. `peak_heap_bytes` includes it.
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
                     cache: dict | None = None, *, platform: str = "",
                     device: str = "", libtpu: str = "") -> Liveness:
  """Live ranges of `dataflow`'s values and buffers, and the peak memory;
  with `edits`, of the program those edits describe. `cache`: a dict kept
  between runs on the same module, schedule and dataflow (what-if replays),
  where the tables no edit changes are made once. `platform`: the backend
  that compiled the module ("gpu", "cpu", ""), whose buffer-sharing rules
  apply; `device`: the TPU generation it was compiled for, `libtpu` the
  version of the libtpu that compiled it (`heap_model`)."""
  tables = cache.get("liveness_tables") if cache is not None else None
  if tables is None or not tables.serves(module, schedule, dataflow):
    base = tables if tables is not None and tables.extends_to(
        module, schedule, dataflow) else None
    tables = _Tables(module, schedule, dataflow, base, heap_model(platform, device, libtpu))
    if cache is not None and base is None:
      cache["liveness_tables"] = tables
  end = schedule.end
  comps = tables.comps
  value_ranges = tables.value_ranges
  parameter_buffers = tables.parameter_buffers
  output_buffers = tables.output_buffers
  sizes = tables.sizes
  placing = tables.placing
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
      placing = [x for x in placing if x[0] not in edits.dropped]

  ranges = {}
  for b, members in dataflow.buffers.items():
    if len(members) == 1:  # most buffers hold one value
      ranges[b] = value_ranges[members[0]]
    else:
      ranges[b] = (min(value_ranges[v][0] for v in members),
                   max(value_ranges[v][1] for v in members))

  sharer = tables.sharer
  allocation_of, allocation_sizes, heap = _assign(tables, placing, value_ranges, sharer)
  model = tables.model
  heap_reuses = _heap_reuses(tables, dataflow, schedule, heap, ranges, sizes, sharer,
                             strict=model.strict_operand_sharing)

  # Heap occupancy over time, buffers that take over another's memory merged.
  merged: dict[ValueId, list[int]] = {}
  for b in heap:
    root = b
    while root in heap_reuses:
      root = heap_reuses[root]
    r = ranges[b]
    size = sizes[b]
    m = merged.get(root)
    if m is None:
      merged[root] = [r[0], r[1], size]
      continue
    if r[0] < m[0]:
      m[0] = r[0]
    if r[1] > m[1]:
      m[1] = r[1]
    if size > m[2]:
      m[2] = size
  intervals = list(merged.values())
  if edits is not None:
    intervals.extend(edits.extra)
  heap_line = _timeline(intervals, end)
  live_heap = max(heap_line, default=0)
  peak_time = heap_line.index(live_heap) if heap_line else 0
  peak_heap = live_heap
  if model.packing_alignment is not None:
    packed = _packed_heap(
        dataflow, comps, heap, value_ranges, sizes, sharer, model,
        edits.extra if edits is not None else (), tables.tuple_tables())
    if model.tpu_temp:
      in_kernels = bool(edits is not None and edits.extra) or any(
          sizes[b] and not _scalar_outside_kernels(tables.value_info[b][0]) for b in heap)
      peak_heap = tpu_reported_temp(packed, live_heap if in_kernels else 0,
                                    tables.tuple_tables(), model.packing_alignment)
    else:
      peak_heap = max(live_heap, packed)
  fixed = sum(allocation_sizes)
  live_at_peak = tuple([b for b, r in ranges.items() if r[0] <= peak_time <= r[1]])
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


def tpu_reported_temp(packed: int, live: int, tables, alignment: int) -> int:
  """The temp XLA:TPU's `memory_analysis()` reports for a heap packed into
  `packed` bytes whose most bytes live at once, tuple tables aside, are
  `live`: 0 where the heap holds only tuple tables (`live` 0), else twice
  the aligned heap less the bytes live at once, tables included (each table
  is held for the whole program, in a slot of its own).

  This is XLA:TPU's accounting, not the size of its temp allocation: it
  matched `memory_analysis()` byte for byte against the buffer-assignment
  dumps of 21 compiles (libtpu 0.0.42.1 and 0.0.50.1; v4, v5e, v5p, v6e),
  where the allocation's size alone fell short by up to half. It reads as
  the heap plus its fragmentation (the aligned heap less what is live at
  once), which a compile that packs badly pays for.
  """
  if live == 0:
    return 0
  return 2 * align(packed, alignment) - (live + sum(t.size for t in tables))


def _scalar_outside_kernels(inst: Instruction) -> bool:
  """A scalar an unfused op computes (optax's bias corrections): XLA:TPU's
  heap holds it, yet a heap of these and tuple tables reports no temp (the
  suite's MoE: two beside 36 tables, `memory_analysis()` temp 0; a fusion's
  scalar output counts, penzai's)."""
  shape = inst.shape
  return (shape is not None and shape.is_array and shape.rank == 0 and
          inst.opcode not in ("fusion", "custom-call"))


def _packed_heap(dataflow, comps, heap, value_ranges, sizes, sharer, model: HeapModel,
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

  return pack_heap(values, alignment=model.packing_alignment, operands=operands,
                   may_overwrite=sharer.can_follow, orders=model.packing_orders)


class _Tables:
  """What analyze_liveness derives from the program alone, before any edit:
  XLA's live ranges, the read-only and output buffers, sizes, the
  assigner's order and the sharer (what-if replays reuse them)."""

  __slots__ = ("module", "schedule", "dataflow", "comps", "value_ranges",
               "parameter_buffers", "output_buffers", "sizes", "order", "placing",
               "sharer", "position", "unextended", "model", "use_time", "_tables",
               "value_info", "tops", "reads")

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
      position, comp_rank = self.position = _post_order_positions(comps)
      time = schedule.time
      uses = dataflow.uses
      use_time = self.use_time = _use_times(comps, time, span)
      value_ranges: dict[ValueId, tuple[int, int]] = {}
      # Per value, what no alias changes: its instruction, bytes, whether a
      # constant defines it, and its part of the assigner's sort key
      # (post-order position, and the (computation rank, position, index)
      # XLA's value ids follow).
      value_info: dict[ValueId, tuple[Instruction, int, bool, int, tuple]] = {}
      # Values share their Shape objects (the parser's), whose sizes are
      # computed on each ask.
      shape_bytes: dict[int, int] = {}
      for vid, value in dataflow.values.items():
        name = vid[0]
        comp_name = value.computation
        inst = comps[comp_name].instruction(name)
        t = time[name]
        opcode = inst.opcode
        start = span[comp_name][0] if opcode == "parameter" else t
        last = t
        for user, _ in uses.get(vid, ()):
          ut = use_time.get(user, -1)
          if ut > last:
            last = ut
        value_ranges[vid] = (start, last)
        shape = value.shape
        size = shape_bytes.get(id(shape))
        if size is None:
          size = shape_bytes[id(shape)] = value.byte_size
        p = position.get(name, 0)
        value_info[vid] = (inst, size, opcode == "constant", p,
                           (comp_rank.get(comp_name, 0), p, vid[1]))
      for comp_name, comp in comps.items():
        comp_end = span[comp_name][1]
        for _, vid in dataflow.holds.get(comp.root_name, ()):
          r = value_ranges.get(vid)
          if r is not None and comp_end > r[1]:
            value_ranges[vid] = (r[0], comp_end)
      self.value_info = value_info
      # Operand values by instruction, filled as the assigner and the heap ask.
      self.tops: dict[str, list[ValueId]] = {}
      self.reads: dict[str, list[tuple[str, ValueId]]] = {}
    else:
      self.position = base.position
      self.use_time = base.use_time
      self.value_info, self.tops, self.reads = base.value_info, base.tops, base.reads
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
    outputs = self.output_buffers = frozenset(
        dataflow.buffer_of[vid] for _, vid in dataflow.holds.get(entry.root_name, ()))
    # XLA's order: largest first, live-out first, then the earliest defining
    # instruction in post order (entry first), then the buffer's id (its
    # first value's). Models with many equal-sized buffers depend on this
    # tie-break.
    value_info = self.value_info
    constants_in_program = (model or heap_model("")).constants_in_program if base is None \
        else base.model.constants_in_program
    sizes: dict[ValueId, int] = {}
    keys: list[tuple] = []
    placing: list[tuple[ValueId, tuple[ValueId, ...], int, bool, bool]] = []
    for b, members in dataflow.buffers.items():
      if len(members) == 1:  # most buffers hold one value
        _, size, constant, first, buffer_id = value_info[members[0]]
      else:
        infos = [value_info[v] for v in members]
        size = max(x[1] for x in infos)
        constant = value_info[b][2]
        first = min(x[3] for x in infos)
        buffer_id = min(x[4] for x in infos)
      if constant and constants_in_program:
        size = 0  # the executable holds it, not the device's memory
      sizes[b] = size
      live_out = b in outputs
      keys.append((-size, not live_out, first, buffer_id))
      placing.append((b, members, size, constant or b in parameter_buffers, live_out))
    self.sizes = sizes
    # (Sorting positions keeps ties in the buffers' order, as sorting them would.)
    ranked = sorted(range(len(keys)), key=keys.__getitem__)
    #: (buffer, its values, bytes, read-only, live-out) in the assigner's order.
    self.placing = [placing[i] for i in ranked]
    self.order = [x[0] for x in self.placing]
    # The sharer reads values, holds and computations only.
    self.model = (model or heap_model("")) if base is None else base.model
    self._tables = None if base is None else base._tables
    self.sharer = (_Sharer(module, comps, dataflow, self.model.can_share)
                   if base is None else base.sharer)

  def tops_of(self, vid: ValueId) -> list[ValueId]:
    """The top-level values of `vid`'s instruction's operands, in operand
    order (the allocations the assigner tries first); kept by instruction."""
    self._operand_values(vid)
    return self.tops[vid[0]]

  def reads_of(self, vid: ValueId) -> list[tuple[str, ValueId]]:
    """(operand, value it holds) for every value of `vid`'s instruction's
    operands, in operand order; kept by instruction."""
    self._operand_values(vid)
    return self.reads[vid[0]]

  def _operand_values(self, vid: ValueId) -> None:
    # Both at once: the heap asks of the instructions the assigner asked of.
    holds = self.dataflow.holds
    tops = self.tops[vid[0]] = []
    reads = self.reads[vid[0]] = []
    for o in self.value_info[vid][0].operands:
      for idx, ov in holds.get(o, ()):
        reads.append((o, ov))
        if idx == ():
          tops.append(ov)

  def tuple_tables(self) -> list:
    """The tuple values' pointer tables on the heap (tuple_tables.py); held
    for the whole program where the backend does (XLA:TPU)."""
    if self._tables is None:
      tables = tuple_tables(self.module, self.schedule, self.comps, self.use_time,
                            self.model.tuple_table_bytes)
      if self.model.tpu_temp:
        end = self.schedule.end
        tables = [dataclasses.replace(t, start=0, end=end) for t in tables]
      self._tables = tables
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
    # user instruction -> value -> (operand number, index in that operand)
    # of each place its operands hold the value; made as users are asked of.
    self._slots: dict[str, dict[ValueId, list[tuple[int, tuple[int, ...]]]]] = {}
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
      slots = self._slots.get(user[0])
      if slots is None:
        slots = self._slots[user[0]] = {}
        holds = self.dataflow.holds
        for k, o in enumerate(user_inst.operands):
          for idx, v in holds.get(o, ()):
            at = slots.get(v)
            if at is None:
              slots[v] = [(k, idx)]
            else:
              at.append((k, idx))
      for k, idx in slots.get(operand, ()):
        if self.rule(self.module, comp, user_inst, k, idx, user[1]):
          result = True
          break
    self._cache[key] = result
    return result


class _Allocation:
  """One allocation: its size and the values in it, sorted by start."""

  __slots__ = ("size", "readonly", "starts", "spans", "reach", "covered")

  def __init__(self, size: int, readonly: bool):
    self.size = size
    self.readonly = readonly
    self.starts: list[int] = []
    self.spans: list[tuple[int, int, ValueId]] = []
    # reach[j]: the furthest end among spans[:j + 1]. A buffer's own values
    # may overlap (loop state), so a span can hide behind later ones.
    self.reach: list[int] = []
    # The spans hold every time from 0 to `covered` (-1: not time 0). All
    # spans starting at or before it are within it.
    self.covered = -1

  def fits(self, values, sharer: _Sharer) -> bool:
    starts, spans, reach = self.starts, self.spans, self.reach
    for start, last, vid in values:
      # Only spans starting at or before `last` can overlap, and of those
      # only the ones reaching `start`; one overlapping other than at an end
      # interferes, one touching an end unless a value may follow the other
      # (LiveRangeInterferes).
      j = bisect.bisect_right(starts, last) - 1
      while j >= 0 and reach[j] >= start:
        s, e, other = spans[j]
        if e >= start:
          if last == s:
            if not sharer.can_follow(vid, other):
              return False
          elif e == start:
            if not sharer.can_follow(other, vid):
              return False
          else:
            return False
        j -= 1
    return True

  def add(self, values) -> None:
    starts, spans, reach = self.starts, self.spans, self.reach
    for start, last, vid in values:
      i = bisect.bisect_right(starts, start)
      starts.insert(i, start)
      spans.insert(i, (start, last, vid))
      r = max(last, reach[i - 1]) if i else last
      reach.insert(i, r)
      k = i + 1
      while k < len(reach) and reach[k] < r:
        reach[k] = r
        k += 1
      covered = self.covered
      joined = covered if covered > 0 else 0
      if start <= joined and last > covered:
        # The span extends the covered times, up to the later spans it
        # reaches (the ones starting at or before `joined` are within).
        covered = last
        k = bisect.bisect_right(starts, joined)
        while k < len(starts) and starts[k] <= covered:
          if spans[k][1] > covered:
            covered = spans[k][1]
          k += 1
        self.covered = covered


class _Occupancy:
  """Which reusable allocations hold a value at each time, to skip the ones
  a buffer cannot fit without trying them.

  A segment tree over doubled time: a span [s, e] of allocation i sets bit i
  on the points 2s..2e, and a value [s, e] can only fit allocations with no
  bit set on 2s+1..2e-1. That is exactly "no span overlaps it other than at
  an end" (what `_Allocation.fits` rejects without asking the sharer);
  touching ends are left to it. Each node keeps `cover`, the
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
    cover, any_, size = self.cover, self.any, self.size
    for start, last, _ in values:
      lo = 2 * (start if start > 0 else 0) + size
      hi = 2 * last + size + 1
      if lo >= hi:
        continue
      # Every node on the paths from the ends to the root holds a point of
      # the span (and a node holding the bit has ancestors holding it).
      node = lo >> 1
      while node and not any_[node] & bit:
        any_[node] |= bit
        node >>= 1
      node = (hi - 1) >> 1
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

  def busy(self, values, mask: int = -1) -> int:
    """The allocations (bits) some value overlaps other than at an end;
    of those in `mask` only: the walk stops once all of them are found."""
    out = 0
    cover, any_, size = self.cover, self.any, self.size
    for start, last, _ in values:
      lo = 2 * (start if start > 0 else 0) + 1 + size
      hi = 2 * last + size
      if lo >= hi:
        continue
      # First the nodes above the ones read that a span covers whole: the
      # two ends' paths to the root, shared above where they meet. Every
      # span holding the first point is among them, which on long-lived
      # allocations often settles the whole mask.
      a, b = lo >> 1, (hi - 1) >> 1
      while a != b:
        out |= cover[a] | cover[b]
        a >>= 1
        b >>= 1
      while a:
        out |= cover[a]
        a >>= 1
      if out & mask == mask:
        return out
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
    return out


def _assign(tables, placing, value_ranges, sharer):
  """XLA's BufferAssigner over our buffers, in `placing`'s order
  (`_Tables.placing`); returns (allocation of each placed buffer, allocation
  sizes, heap buffers)."""
  allocations: list[_Allocation] = []
  program_end = max((r[1] for r in value_ranges.values()), default=0)
  occupancy = _Occupancy(program_end)
  busy_of, occupy = occupancy.busy, occupancy.add
  reusable = 0  # bits of the allocations a temporary may join
  temporaries_share = tables.model.temporaries_share_outputs
  # size -> bits of the reusable allocations of that size (the only ones a
  # live-out buffer may join).
  reusable_sized: dict[int, int] = {}
  # Bits of the allocations holding every time: a value other than a point
  # overlaps them (they are busy for it); the occupancy leaves them out.
  full = 0
  allocation_of: dict[ValueId, int] = {}
  # value -> the reusable allocation its buffer is in (what an operand's
  # value offers).
  value_allocation: dict[ValueId, int] = {}
  heap: list[ValueId] = []
  tops, tops_of = tables.tops, tables.tops_of
  for b, members, size, readonly, live_out in placing:
    if len(members) == 1:
      v = members[0]
      r = value_ranges[v]
      values = [(r[0], r[1], v)]
    else:
      values = [(value_ranges[v][0], value_ranges[v][1], v) for v in members]
    if readonly:
      alloc = _Allocation(size, readonly=True)
      alloc.add(values)
      allocation_of[b] = len(allocations)
      allocations.append(alloc)
      continue
    # Every allocation a buffer may join is in `candidates`; which of them a
    # value overlaps other than at an end (they cannot fit) is asked once,
    # and only if one passes the cheaper tests.
    candidates = (reusable_sized.get(size, 0) if live_out else
                  reusable if temporaries_share else 0)
    if candidates & full:
      for start, last, _ in values:
        if last > start and last > 0:
          candidates &= ~full
          break
    busy = -1
    where = -1
    # Operands' allocations first (top-level values only), for locality.
    for v in members if candidates else ():
      if v[1] != ():
        continue
      operand_values = tops.get(v[0])
      if operand_values is None:
        operand_values = tops_of(v)
      for ov in operand_values:
        i = value_allocation.get(ov)
        # (Read-only allocations are not offered; the other allocations not
        # in `candidates` are of the wrong size for a live-out buffer, or busy.)
        if i is None or not candidates >> i & 1:
          continue
        alloc = allocations[i]
        if alloc.size < size:
          continue
        if busy < 0:
          busy = busy_of(values, candidates)
        if busy >> i & 1 or not alloc.fits(values, sharer):
          continue
        where = i
        break
      if where >= 0:
        break
    if where < 0 and candidates:
      # Reusable allocations newest first (XLA's order), skipping those a
      # value overlaps other than at an end.
      if busy < 0:
        busy = busy_of(values, candidates)
      free = candidates & ~busy
      while free:
        i = free.bit_length() - 1
        free ^= 1 << i
        alloc = allocations[i]
        if alloc.size >= size and alloc.fits(values, sharer):
          where = i
          break
    if where >= 0:
      alloc = allocations[where]
      alloc.add(values)
      allocation_of[b] = where
      for v in members:
        value_allocation[v] = where
      if alloc.covered >= program_end:
        full |= 1 << where
      else:
        occupy(values, where)
      continue
    if not live_out:
      heap.append(b)
      continue
    i = len(allocations)
    alloc = _Allocation(size, readonly=False)
    alloc.add(values)
    allocations.append(alloc)
    allocation_of[b] = i
    for v in members:
      value_allocation[v] = i
    bit = 1 << i
    reusable |= bit
    reusable_sized[size] = reusable_sized.get(size, 0) | bit
    if alloc.covered >= program_end:
      full |= bit
    else:
      occupy(values, i)
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
    if top in seen:
      continue
    seen.add(top)
    stack = [(top, iter(comps[top].instructions))]
    while stack:
      if len(seen) == len(comps):
        # Nothing is left to find: what remains finishes as stacked.
        callee_first.extend(name for name, _ in reversed(stack))
        break
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
    instruction = comp.instruction
    used = {o for inst in comp.instructions for o in inst.operands}
    visiting: set[str] = set()
    for start in comp.instructions:
      if start.name in used or start.name in position:
        continue
      stack = [start.name]
      push, pop = stack.append, stack.pop
      while stack:
        cur = stack[-1]
        if cur in position:
          pop()
        elif cur in visiting:
          pop()
          position[cur] = len(position)
        else:
          visiting.add(cur)
          inst = instruction(cur)
          for o in reversed(inst.operands):
            if o not in position:
              push(o)
          # Pushed last, so visited first (XLA's stack order).
          for o in inst.control_predecessors:
            if o not in position and o in comp:
              push(o)
  return position, {name: i for i, name in enumerate(callee_first)}


def _heap_reuses(tables, dataflow, schedule, heap, ranges, sizes, sharer, *,
                 strict: bool = False):
  """Heap buffers that take over a dying operand's heap memory in place (the
  heap simulator's ShareWith): buffer -> the buffer whose memory it takes.
  `strict`: as XLA's heap simulator has it, only between buffers of one
  value each, whatever their sizes."""
  buffers = dataflow.buffers
  heap_buffer_of = {v: b for b in heap for v in buffers[b]}
  reuses: dict[ValueId, ValueId] = {}
  taken: set[ValueId] = set()
  time = schedule.time
  reads, reads_of = tables.reads, tables.reads_of
  for b in sorted(heap, key=lambda b: ranges[b][0]):
    start = ranges[b][0]
    members = buffers[b]
    size = sizes[b]
    for v in members:
      if start != time.get(v[0]):
        continue
      pairs = reads.get(v[0])
      if pairs is None:
        pairs = reads_of(v)
      for operand, ov in pairs:
        ob = heap_buffer_of.get(ov)
        if ob is None or strict and (
            len(members) != 1 or len(buffers[ob]) != 1
            or ov[0] != operand):  # XLA: a value its direct operand defines
          continue
        if (ob not in taken and ob != b and
            ranges[ob][1] == start and (strict or sizes[ob] >= size) and
            sharer.can_follow(ov, v)):
          reuses[b] = ob
          taken.add(ob)
          break
      if b in reuses:
        break
  return reuses


def _timeline(intervals, end: int) -> list[int]:
  delta = [0] * (end + 2)
  for start, last, size in intervals:
    delta[max(start, 0)] += size
    delta[min(last, end) + 1] -= size
  return list(itertools.accumulate(delta[:end]))
