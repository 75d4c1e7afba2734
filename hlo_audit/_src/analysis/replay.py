"""What-if replays: the peak after a change the user can make.

A replay runs the liveness analysis again (XLA's BufferAssigner and heap, see
liveness.py) on the program a change would produce, described as edits of the
original's buffers rather than by recompiling:

- fuse a finding: its boundary buffer is never written; the fused kernel runs
  where the last consumer ran, so the producer's inputs live until then, or,
  when the consumers' other inputs are ready by then, where the producer ran,
  so the consumers' results live from then: the lower peak of the two.
- donate an argument: the module gains the `input_output_alias` entries JAX
  would add (donation.py), and dataflow and liveness run on that module.
- remat a buffer: it is kept until its first group of uses only; before the
  later group (the backward pass) it is recomputed, a temporary living from
  the first of those uses to the last, and its producer's inputs stay live
  until then (as `jax.checkpoint` would do).
- drop a buffer: it is gone (an upper bound on what removing it can give).
- unsplit a split-K gemm (split_k.py): its partial sums `[k, M, N]` become
  its `[M, N]` result, live as long, as a kernel replacing the gemm that
  does not split K (a Pallas matmul) would write it.

A quick replay keeps the audited buffer assignment and sums the heap again;
a full one assigns every buffer again. Each finding gets the quick estimate,
and full replays go to those that can move the peak, the largest first,
within one budget per audit.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping, Sequence

from hlo_audit._src.analysis.dataflow import (Dataflow, ValueId, analyze_dataflow,
                                              with_output_aliases)
from hlo_audit._src.analysis.donation import (aliasing_copies, donation_aliases, with_copies,
                                              with_donation)
from hlo_audit._src.analysis.liveness import LivenessEdits, analyze_liveness
from hlo_audit._src.analysis.program import (Program, WhatIfError, buffer_name, find_buffer,
                                             parameter_paths, resolve_arguments,
                                             resolve_buffer)
from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, with_changes
from hlo_audit._src.analysis.schedule import Schedule, flatten_schedule
from hlo_audit._src.analysis.split_k import split_k_partials


@dataclasses.dataclass(frozen=True, slots=True)
class WhatIf:
  """The outcome of a what-if replay."""

  #: The changes replayed, in words, e.g. "donate params['w']".
  changes: tuple[str, ...]
  baseline_peak_bytes: int
  peak_bytes: int
  #: Time of the new peak, and what is live then.
  peak_time: int
  live_at_peak: tuple[str, ...]
  #: Live bytes per schedule step, before and after.
  baseline_timeline: tuple[int, ...]
  timeline: tuple[int, ...]
  notes: tuple[str, ...] = ()
  #: The estimated step before and after the changes (seconds; None without
  #: a time estimate): fusions save their findings' `time_saved`, a remat
  #: costs its recompute.
  baseline_step_time: float | None = None
  step_time: float | None = None

  @property
  def peak_saved(self) -> int:
    return self.baseline_peak_bytes - self.peak_bytes

  def to_dict(self) -> dict:
    return {"changes": list(self.changes),
            "baseline_peak_bytes": self.baseline_peak_bytes,
            "peak_bytes": self.peak_bytes, "peak_saved": self.peak_saved,
            "peak_time": self.peak_time, "live_at_peak": list(self.live_at_peak),
            "baseline_timeline": list(self.baseline_timeline),
            "timeline": list(self.timeline), "notes": list(self.notes),
            "baseline_step_time": self.baseline_step_time, "step_time": self.step_time}

  def __str__(self) -> str:
    from hlo_audit._src.report.what_if_text import render_what_if

    return render_what_if(self)


# --------------------------------------------------------------- replay ----


def replay(program: Program, *, fuse: Sequence[tuple[str, str, Sequence[str]]] = (),
           donate: Sequence[int | str] = (), remat: Sequence[str] = (),
           drop: Sequence[str] = (), unsplit: Sequence[str] = (),
           quick: bool = False,
           second_assignment: Callable[[], bool] = lambda: True) -> WhatIf | int:
  """Replays the liveness of `program` with the changes applied.

  With `quick`, returns only the new peak, keeping the audited buffer
  assignment (each allocation shrinks to its remaining buffers, the heap is
  summed again): the per-finding peaks, where a full assignment per finding
  would cost a second each on large modules.

  Args:
    program: the audited program.
    fuse: (boundary buffer, producer kernel, consumer kernels) per fusion.
    donate: arguments to donate (see `resolve_arguments`).
    remat: buffers to recompute before their later uses.
    drop: buffers to remove.
    unsplit: split-K partial sums (buffer names) whose gemm writes its result
      once instead.
    second_assignment: asked when a fusion has two placements: whether a
      second full assignment may run (an audit's budget); if not, the quick
      estimates pick the placement to assign.

  Raises:
    WhatIfError: for a name the program lacks, or an `unsplit` buffer that
      holds no gemm's split-K partial sums.
  """
  module, schedule, dataflow = program.module, program.schedule, program.dataflow
  base = program.liveness
  changes: list[str] = []
  notes: list[str] = []
  # (first time, count) of copies the donation inserts; None: none.
  inserted: tuple[int, int] | None = None
  if donate:
    parameters = resolve_arguments(program, donate)
    pairs = donation_aliases(module, dataflow, parameters)
    paths = parameter_paths(module)
    aliased = {n for _, n in pairs}
    for spec in donate:
      leaves = [n for n in resolve_arguments(program, [spec]) if n in aliased]
      if len(leaves) == 1:
        changes.append(f"donate {paths[leaves[0]]}")
      elif leaves:
        changes.append(f"donate {spec} ({len(leaves)} arrays)")
    unmatched = [paths[n] for n in parameters if n not in aliased]
    if unmatched:
      notes.append("no output of the same shape and dtype to reuse (JAX would "
                   "warn and ignore the donation): " + ", ".join(unmatched))
    copies = aliasing_copies(module, dataflow, schedule, pairs,
                             reorders=program.heap.reorders_for_donation)
    for n, _, _, size in copies:
      notes.append(f"XLA copies {paths[n]} ({size} B): a read of it is not "
                   "ordered before the write of its aliased output")
    if pairs:
      module = with_donation(module, pairs)
      if copies:
        # The copies as instructions, in a schedule and dataflow of their own
        # (the aliases read from the module); the edits below are made in
        # the audited program's times and moved past the copies at the end.
        module, _ = with_copies(module, [n for n, *_ in copies])
        schedule = flatten_schedule(module)
        dataflow = analyze_dataflow(module, schedule)
        inserted = (min(first for _, first, _, _ in copies), len(copies))
      else:
        dataflow = with_output_aliases(dataflow, module, [(i, n, ()) for i, n in pairs])
  base_ranges = base.value_ranges
  time = program.schedule.time
  dropped: set[ValueId] = set()
  ranges: dict[ValueId, tuple[int, int]] = {}
  extra: list[tuple[int, int, int]] = []

  def value_range(v: ValueId) -> tuple[int, int]:
    return ranges.get(v, base_ranges[v])

  def keep_inputs_until(inst_name: str, t: int, into: dict | None = None) -> None:
    into = ranges if into is None else into
    inst = program.find_instruction(inst_name)
    if inst is None:
      return
    for operand in inst.operands:
      for _, v in dataflow.holds.get(operand, ()):
        if v in base_ranges:
          s, e = into.get(v, base_ranges[v])
          if e < t:
            into[v] = (s, t)

  for name in drop:
    dropped.add(resolve_buffer(dataflow, name))
    changes.append(f"drop {name}")
  # A fused kernel may run where its last consumer ran (the producer's
  # inputs then live until there) or, where the consumers' other inputs are
  # ready by then, where the producer ran (their results then live from
  # there): the replay keeps the placement with the lower peak, as a
  # scheduler minimizing memory would. `early` is the second placement
  # (None: no fusion can move, or a remat's edits would depend on it).
  early: dict[ValueId, tuple[int, int]] | None = dict(ranges) if fuse and not remat else None
  moved = False
  for boundary, producer, consumers in fuse:
    b = resolve_buffer(dataflow, boundary)
    dropped.add(b)
    last = max((time[c] for c in consumers if c in time), default=None)
    if last is not None and producer:
      keep_inputs_until(producer, last)
      if early is not None:
        at_producer = _run_at_producer(program, b, producer, consumers)
        if at_producer is None:
          keep_inputs_until(producer, last, into=early)
        else:
          early.update(at_producer)
          moved = True
    changes.append(f"fuse {boundary} ({producer or 'input'} -> "
                   f"{', '.join(consumers) or '?'})")
  if not moved:
    early = None
  partials = split_k_partials(program) if unsplit else {}
  for name in unsplit:
    b = resolve_buffer(dataflow, name)
    found = partials.get(buffer_name(b))
    if found is None:
      known = ", ".join(sorted(partials)[:4]) or "none"
      raise WhatIfError(f"unsplit {name!r}: the buffer holds no gemm's split-K partial "
                        f"sums (the program's: {known})")
    changes.append(f"unsplit {found.gemm} ({found.splits} partial sums, "
                   f"{found.bytes} -> {found.result_bytes} B)")
    if b in dropped:
      continue  # fused away too: the result is never written either
    dropped.add(b)
    members = dataflow.buffers[b]
    extra.append((min(value_range(v)[0] for v in members),
                  max(value_range(v)[1] for v in members), found.result_bytes))
  for name in remat:
    b = resolve_buffer(dataflow, name)
    members = dataflow.buffers[b]
    if len(members) != 1:
      raise WhatIfError(f"remat {name!r}: the buffer is shared by {len(members)} "
                        "values (loop state or an alias); only a plain value can "
                        "be recomputed")
    # (In the audited program's times, as every edit here.)
    split = remat_split(program.dataflow, program.schedule, base_ranges, b)
    if split is None:
      notes.append(f"remat {name}: its uses form one group; nothing to recompute")
      continue
    kept_last, again_first, again_last = split
    ranges[b] = (value_range(b)[0], kept_last)
    extra.append((again_first, again_last, dataflow.buffer_bytes(b)))
    keep_inputs_until(b[0], again_first)
    changes.append(f"remat {name}")
  if inserted is not None:
    ranges = {v: _moved(r, inserted) for v, r in ranges.items()}
    extra = [(*_moved((a, b), inserted), size) for a, b, size in extra]
    if early is not None:
      early = {v: _moved(r, inserted) for v, r in early.items()}
  edits = LivenessEdits(dropped=frozenset(dropped),
                        value_ranges=types.MappingProxyType(ranges), extra=tuple(extra))
  early_edits = None if early is None else dataclasses.replace(
      edits, value_ranges=types.MappingProxyType(early))
  if quick:
    if donate:
      raise WhatIfError("a quick replay keeps the buffer assignment: donation changes it")
    peak = quick_peak(program, edits)
    return peak if early_edits is None else min(peak, quick_peak(program, early_edits))
  if early_edits is not None and not donate and not second_assignment():
    # One full assignment, of the placement the quick estimates favour (a
    # tie goes to the producer's place: it keeps no input longer).
    if quick_peak(program, early_edits) <= quick_peak(program, edits):
      edits = early_edits
      notes.append(_AT_PRODUCERS)
    early_edits = None
  device = program.device.name if program.device is not None else ""
  # Tables shared between replays (a donated program's derived from them).
  after = analyze_liveness(module, schedule, dataflow, edits, cache=program.cache,
                           platform=program.platform, device=device,
                           libtpu=program.libtpu_version)
  if early_edits is not None:
    at_producers = analyze_liveness(module, schedule, dataflow, early_edits,
                                    cache=program.cache, platform=program.platform,
                                    device=device, libtpu=program.libtpu_version)
    if at_producers.peak_bytes < after.peak_bytes:
      notes.append(_AT_PRODUCERS)
      after = at_producers
  timeline, peak_time = after.timeline, after.peak_time
  if inserted is not None:
    # Back on the audited program's steps: the copies' steps as one, at the
    # step before which they run (its live bytes the most of theirs).
    at, k = inserted
    timeline = (*timeline[:at], max(timeline[at:at + k + 1]), *timeline[at + k + 1:])
    peak_time = peak_time if peak_time < at else max(at, peak_time - k)
  return WhatIf(
      changes=tuple(changes), baseline_peak_bytes=base.peak_bytes,
      peak_bytes=after.peak_bytes, peak_time=peak_time,
      live_at_peak=tuple(buffer_name(b) for b in after.live_at_peak),
      baseline_timeline=base.timeline, timeline=tuple(timeline), notes=tuple(notes))


def _moved(r: tuple[int, int], inserted: tuple[int, int]) -> tuple[int, int]:
  """A range in the audited program's times, in those of the program with
  `inserted` = (first time, count) copies run before that time."""
  at, k = inserted
  return (r[0] + k if r[0] >= at else r[0], r[1] + k if r[1] >= at else r[1])


#: The note of a fusion replay whose kernels moved to their producers' place.
_AT_PRODUCERS = ("fused kernels run where their producers ran (their consumers' "
                 "other inputs are ready by then)")


def _run_at_producer(program: Program, boundary: ValueId, producer: str,
                     consumers: Sequence[str]) -> dict[ValueId, tuple[int, int]] | None:
  """Live ranges when the kernel fusing `producer` into `consumers` runs
  where the producer ran: the consumers' results written from there, and
  their inputs read there (a value the consumers read last dies there).
  None when it cannot run there: a consumer in another computation, or an
  input of theirs (other than the boundary and each other's results)
  written later."""
  dataflow, time = program.dataflow, program.schedule.time
  ranges = program.liveness.value_ranges
  t = time.get(producer)
  produced = dataflow.holds.get(producer)
  if t is None or not produced or not consumers:
    return None
  comp = dataflow.values[produced[0][1]].computation
  out: dict[ValueId, tuple[int, int]] = {}
  names = set(consumers)
  read: set[ValueId] = set()
  for c in consumers:
    held = dataflow.holds.get(c)
    if c not in time or not held:
      return None
    inst = program.find_instruction(c)
    if inst is None:
      return None
    for _, v in held:
      if v[0] == c:
        if dataflow.values[v].computation != comp or v not in ranges:
          return None
        s, e = ranges[v]
        out[v] = (min(s, t), e)
    for operand in inst.operands:
      for _, v in dataflow.holds.get(operand, ()):
        if dataflow.buffer_of.get(v) == boundary or v[0] in names:
          continue
        if v not in ranges or ranges[v][0] > t:
          return None
        read.add(v)
  last = max(time[c] for c in consumers)
  for v in read:
    # Read last by the consumers (at their times), it now dies at `t`;
    # forwarded (a tuple, a get-tuple-element) or read elsewhere, it keeps
    # its range. (Its end first: a weight read by every layer is read later.)
    s, e = ranges[v]
    if e != last or v in out:
      continue
    others = [u for u, _ in dataflow.uses.get(v, ()) if u not in names]
    if any(u not in time for u in others):
      continue
    users = [program.find_instruction(u) for u in others]
    if any(u is None or u.opcode in ("tuple", "get-tuple-element", "bitcast")
           for u in users):
      continue
    end = max([t, *(time[u] for u in others)])
    if end < e:
      out[v] = (s, end)
  return out


def _heap_tables(program: Program) -> dict:
  """Heap groups (a buffer and those taking its memory in place), the heap's
  timeline, and each allocation's buffers, as analyze_liveness has them
  (made on first use, shared by every quick replay)."""
  import numpy as np

  base, cache = program.liveness, program.cache
  if "heap" not in cache:
    root_of, groups = {}, {}
    for b in base.heap_buffers:
      root = b
      while root in base.heap_reuses:
        root = base.heap_reuses[root]
      root_of[b] = root
      groups.setdefault(root, []).append(b)
    line = np.zeros(len(base.timeline) + 1, dtype=np.int64)
    for members in groups.values():
      s_, e_, size = _group_span(members, base.ranges, base.sizes)
      line[s_:e_ + 1] += size
    members_of: dict[int, list[ValueId]] = {}
    for b, i in base.allocation_of.items():
      members_of.setdefault(i, []).append(b)
    # Largest first, as the assignment placed them (sorted so that a drop's
    # read of the top does not rest on that order).
    for members in members_of.values():
      members.sort(key=base.sizes.__getitem__, reverse=True)
    cache.update(heap=line[:len(base.timeline)], root_of=root_of, groups=groups,
                 members_of=members_of, allocation_total=sum(base.allocation_sizes))
  return cache


def quick_peak(program: Program, edits: LivenessEdits) -> int:
  """The peak with `edits`, keeping `program`'s buffer assignment: only the
  heap groups and allocations the edits touch are summed again. A packed
  heap (XLA:GPU's, XLA:TPU's) keeps the program's fragmentation: only a
  full replay packs it again."""
  base, dataflow = program.liveness, program.dataflow
  cache = _heap_tables(program)
  root_of, groups, members_of = cache["root_of"], cache["groups"], cache["members_of"]
  ranges: dict[ValueId, tuple[int, int]] = {}
  for v in edits.value_ranges:
    b = dataflow.buffer_of.get(v)
    if b is not None and b in base.ranges:
      members = dataflow.buffers[b]
      ranges[b] = (min(edits.value_ranges.get(m, base.value_ranges[m])[0] for m in members),
                   max(edits.value_ranges.get(m, base.value_ranges[m])[1] for m in members))
  # An allocation a drop empties shrinks to its largest member left (the
  # module's allocations are many: only those changed are summed again).
  total = cache["allocation_total"]
  for i in {base.allocation_of[b] for b in edits.dropped if b in base.allocation_of}:
    left = next((b for b in members_of[i] if b not in edits.dropped), None)
    total += (base.sizes[left] if left is not None else 0) - base.allocation_sizes[i]
  touched = {root_of[b] for b in (*edits.dropped, *ranges) if b in root_of}
  line = cache["heap"]
  if touched or edits.extra:
    line = line.copy()
    end = len(line)
    full = _Overlay(ranges, base.ranges)
    for root in touched:
      s_, e_, size = _group_span(groups[root], base.ranges, base.sizes)
      line[s_:e_ + 1] -= size
      kept = [b for b in groups[root] if b not in edits.dropped]
      if kept:
        s_, e_, size = _group_span(kept, full, base.sizes)
        line[max(s_, 0):min(e_, end - 1) + 1] += size
    for s_, e_, size in edits.extra:
      line[max(s_, 0):min(e_, end - 1) + 1] += size
  live = int(line.max(initial=0))
  if live == 0 and program.heap.tpu_temp:
    return total  # XLA:TPU reports no temp for a heap of tuple tables alone
  return total + live + base.fragmentation_bytes


class _Overlay:
  """Edited ranges over the audited ones, without copying them."""

  __slots__ = ("top", "base")

  def __init__(self, top, base):
    self.top, self.base = top, base

  def __getitem__(self, key):
    hit = self.top.get(key)
    return hit if hit is not None else self.base[key]


def _group_span(members, ranges, sizes) -> tuple[int, int, int]:
  return (min(ranges[b][0] for b in members), max(ranges[b][1] for b in members),
          max(sizes[b] for b in members))


def remat_split(dataflow: Dataflow, schedule: Schedule,
                value_ranges: Mapping[ValueId, tuple[int, int]],
                b: ValueId) -> tuple[int, int, int] | None:
  """(last time the value is kept, first and last time of its recomputed
  copy), splitting its uses at the widest gap in time; None for one group."""
  start, end = value_ranges[b]
  times = sorted({schedule.time[u] for u, _ in dataflow.uses.get(b, ())
                  if u in schedule.time})
  if len(times) < 1:
    return None
  points = [start] + times
  gaps = [(points[i + 1] - points[i], i) for i in range(len(points) - 1)]
  width, i = max(gaps)
  if i == 0 or width <= 1:
    return None  # the first use is the widest gap: nothing kept short
  return points[i], points[i + 1], max(end, times[-1])


# --------------------------------------------------------------- budget ----

#: Work one audit may spend on full replays of per-finding peaks, in
#: `full_replay_cost` units, per instruction of the module. A unit costs
#: ~7-10 us on one core, the rest of the audit ~12-20 us an instruction, so
#: the what-if part stays near a tenth of the audit: the 12-layer example
#: (34k instructions, 1.4k buffers) gets a donation replay and one more, the
#: rest the quick estimate (marked). Work, not time: a module always gets the
#: same replays.
FULL_REPLAY_WORK_PER_INSTRUCTION = 0.2
#: ...and never less than this many full replays' worth, for unfused modules
#: (mixtral 8x7b: 42k instructions, 29k buffers, gets 2)...
MIN_FULL_REPLAYS = 2
#: ...nor less than this much work (~75 ms): small modules get a full replay
#: for every finding that can move the peak.
MIN_FULL_REPLAY_WORK = 6200


def full_replay_cost(program: Program) -> int:
  """What one full replay takes from the budget: every buffer is assigned
  again, and each the audited assignment placed in an allocation is placed
  again (a fit test and an occupancy update, the dearer part). Buffers
  alone undercount modules whose temporaries pack into output allocations:
  on 8 copies of the example 9k of 10k buffers are placed (0.7k of 1.4k on
  one), and a replay cost 15x one of the example's, not 7x."""
  return len(program.dataflow.buffers) + len(program.liveness.allocation_of)


@dataclasses.dataclass(slots=True)
class ReplayBudget:
  """Full replays one audit may still run (shared by every finding)."""

  #: Work left, in `full_replay_cost` units.
  left: int
  #: Full replays run so far.
  replays: int = 0


def replay_budget(program: Program) -> ReplayBudget:
  """The audit's budget of full replays (made on first use)."""
  budget = program.cache.get("replay_budget")
  if budget is None:
    budget = program.cache["replay_budget"] = ReplayBudget(max(
        int(FULL_REPLAY_WORK_PER_INSTRUCTION * program.module.instruction_count),
        MIN_FULL_REPLAYS * full_replay_cost(program), MIN_FULL_REPLAY_WORK))
  return budget


def take_full_replay(program: Program, *, donation: bool = False) -> bool:
  """Whether the audit's budget allows one more full replay (and takes it).
  A replay costs `full_replay_cost`; a donation replay twice that: it
  pairs parameters with outputs, merges their buffers and derives liveness
  tables for the merged program (22 ms against 14 ms on the example)."""
  budget = replay_budget(program)
  cost = full_replay_cost(program) * (2 if donation else 1)
  if budget.left < cost:
    return False
  budget.left -= cost
  budget.replays += 1
  return True


def peak_mover_bytes(program: Program, boundary: str, producer: str = "",
                     consumers: Sequence[str] = ()) -> int:
  """The bytes of `boundary` when removing it (its producer's inputs kept
  until its last consumer) can move the peak: the buffer is live at the
  heap's peak, or the inputs would be kept over it; 0 otherwise."""
  base = program.liveness
  b = find_buffer(program.dataflow, boundary)
  if b is None:
    return 0
  t, time = base.peak_time, program.schedule.time
  s, e = base.ranges[b]
  last = max((time.get(c, -1) for c in consumers), default=-1)
  if s <= t <= e or (time.get(producer, t + 1) <= t < last):
    return base.sizes[b]
  return 0


def _inputs_may_raise_peak(program: Program, boundary: str, producer: str = "",
                           consumers: Sequence[str] = ()) -> bool:
  """Whether fusing could raise the peak by keeping the producer's inputs
  live until the last consumer: an input outside the heap is kept longer
  (its allocation's packing may change), or the heap with every extended
  input's group added over the window it is extended by reaches the peak."""
  time = program.schedule.time
  last = max((time[c] for c in consumers if c in time), default=None)
  inst = program.find_instruction(producer) if producer else None
  if last is None or inst is None:
    return False
  base, dataflow = program.liveness, program.dataflow
  extended = {dataflow.buffer_of.get(v) for o in inst.operands
              for _, v in dataflow.holds.get(o, ())
              if v in base.value_ranges and base.value_ranges[v][1] < last}
  if not extended:
    return False
  tables = _heap_tables(program)
  roots = set()
  for b in extended:
    if b not in tables["root_of"]:
      return True  # not a heap buffer
    roots.add(tables["root_of"][b])
  start = min(base.ranges[b][1] for b in extended) + 1
  extra = sum(_group_span(tables["groups"][r], base.ranges, base.sizes)[2] for r in roots)
  window = tables["heap"][start:last + 1]
  heap_peak = base.peak_bytes - sum(base.allocation_sizes)
  return len(window) > 0 and int(window.max()) + extra >= heap_peak


def peak_after_fusions(program: Program,
                       fusions: Sequence[tuple[str, str, Sequence[str]] | None]
                       ) -> list[tuple[int, bool] | None]:
  """(peak, exact) after each fusion alone (None where the boundary is not a
  buffer of the program). A heap boundary away from the peak whose inputs are
  kept no longer can neither lower nor raise the peak (exact, unless the
  heap is packed, XLA:GPU's and XLA:TPU's: packing it again without the buffer may move
  the peak by its fragmentation); the others get the quick replay (not
  exact): those that can move the peak get a full one later, the largest
  first, while the audit's budget lasts (`exact_peaks`)."""
  base = program.liveness
  packed = program.heap.packing_alignment is not None
  out: list[tuple[int, bool] | None] = [None] * len(fusions)
  for k, fusion in enumerate(fusions):
    if fusion is None:
      continue
    b = find_buffer(program.dataflow, fusion[0])
    if b is None:
      continue
    if (not peak_mover_bytes(program, *fusion) and b in base.heap_buffers and
        not _inputs_may_raise_peak(program, *fusion)):
      out[k] = (base.peak_bytes, not packed)
    else:
      out[k] = (replay(program, fuse=[fusion], quick=True), False)
  return out


# ------------------------------------------------------ findings' peaks ----


def with_peaks(findings: Sequence[FusionDecisionRecord],
               peaks: Sequence[tuple[int, bool] | None], baseline: int,
               source_stacks: Sequence[tuple] | None = None
               ) -> list[FusionDecisionRecord]:
  """Findings with `peak_after`/`peak_saved`/`peak_exact` filled from
  replayed (peak, exact) pairs, and `source_stack` set from `source_stacks`
  if given (in the same copy: copying a record is a measurable share of an
  audit)."""
  out = []
  for i, (f, p) in enumerate(zip(findings, peaks)):
    changes = {}
    if source_stacks is not None and source_stacks[i] != f.source_stack:
      changes["source_stack"] = source_stacks[i]
    if p is not None and f.peak_after is None:
      changes.update(peak_after=p[0], peak_saved=baseline - p[0], peak_exact=p[1])
    out.append(with_changes(f, **changes) if changes else f)
  return out


def _full_replay_of(f: FusionDecisionRecord) -> dict | None:
  """The `replay` arguments of a finding's change (None: it has none)."""
  if not f.boundary:
    return None
  if f.kind is FindingKind.REMAT_CANDIDATE:
    return {"remat": [f.boundary]}
  if f.kind is FindingKind.COLLECTIVE_MATMUL:
    return {"fuse": [(f.boundary, "", ())]}  # the gathered buffer, dropped
  if f.kind in (FindingKind.UNDONATED_ARGUMENT, FindingKind.REPLICATED_BUFFER):
    return None  # replayed in full, or exact by construction
  return {"fuse": [(f.boundary, f.producer, f.consumers)]}


def exact_peaks(program: Program, findings: Sequence[FusionDecisionRecord],
                min_peak_saved: int = 1) -> list[FusionDecisionRecord | None]:
  """Findings whose peak is the quick estimate and whose change can move the
  peak (`peak_mover_bytes`), replayed in full, the largest boundary first,
  while the audit's budget lasts (`take_full_replay`, shared with every
  other replay of the audit); the rest keep the estimate (`peak_exact`
  False). A remat candidate the full replay shows saving less than
  `min_peak_saved` becomes None (dropped, as the quick one would have been);
  the rest keep their places."""
  wanted = []
  for k, f in enumerate(findings):
    if f.peak_after is None or f.peak_exact:
      continue
    spec = _full_replay_of(f)
    if spec is None:
      continue
    fuse = spec.get("fuse")
    size = (peak_mover_bytes(program, *fuse[0]) if fuse else
            peak_mover_bytes(program, spec["remat"][0]))
    if not size and fuse and _inputs_may_raise_peak(program, *fuse[0]):
      # The quick replay keeps the buffer assignment: inputs kept longer
      # may no longer fit where they were placed.
      b = find_buffer(program.dataflow, fuse[0][0])
      size = program.liveness.sizes.get(b, 0) if b is not None else 0
    if size:
      wanted.append((-size, k, spec))
  out: list[FusionDecisionRecord | None] = list(findings)
  for _, k, spec in sorted(wanted, key=lambda w: w[:2]):
    if not take_full_replay(program):
      break
    what = replay(program, **spec, second_assignment=lambda: take_full_replay(program))
    f = out[k]
    if f.kind is FindingKind.REMAT_CANDIDATE and what.peak_saved < min_peak_saved:
      out[k] = None
      continue
    out[k] = with_changes(f, peak_after=what.peak_bytes,
                          peak_saved=what.peak_saved, peak_exact=True)
  return out
