"""Time on the target: an estimated cost for every kernel, the step along
XLA's schedule, and what each finding's fix buys.

One pass over the kernels the audit already found, priced with the device's
facts (`target/devices.py`) and nothing else:

- A kernel moves its bytes (`Kernel.bytes_read` + `bytes_written`: a fused
  broadcast reads its compact operand, a slice the slice, an in-place update
  its update; a library's workspace is no traffic) at the bandwidth of the
  smallest cache level holding them, else main memory's, and the bytes of
  operands and results XLA keeps on chip (a TPU's VMEM) at the device's
  on-chip rate (`DeviceFacts.on_chip_bandwidth`); does its work
  (`work.Work`) on the units that run it: dots and convolutions on the matrix
  unit at their type's rate, elementwise and reductions at the vector rate,
  transcendentals at the special-function rate; and pays one launch. Its
  time is the roofline of the two, max(memory, compute), plus the launch;
  its bound is whichever is largest.
- A collective moves the bytes a ring algorithm sends per device
  (`collectives.Collective.bytes_sent`) over the device's links, plus a
  fixed latency.
- The step walks XLA's schedule: kernels run one after another; an
  asynchronous collective runs beside the kernels scheduled between its start
  and its done, and only what they do not hide is exposed; a while loop runs
  its body its known trip count times (once where XLA states none); a
  conditional is charged its longest branch.
- A finding's saving: the kernels it names (producer and consumers) before,
  minus one fused kernel after that moves their bytes less the traffic the
  fusion removes (at the boundary's bandwidth) and does their work, with
  the launches it removes; hoisting loop-invariant work saves its
  repetitions; a remat costs its recompute; exposed communication saves what
  was exposed; a resharding copy saves the copy.

What the model leaves out is listed in `StepTime.assumptions`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Iterable, Mapping, Sequence

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, with_changes
from hlo_audit._src.analysis.work import NO_WORK, Work, kernel_work
from hlo_audit._src.target.devices import DeviceFacts

#: Launches the timeline lists one by one; loops beyond it are folded (one
#: bar per kernel for all its iterations).
MAX_EVENTS = 50_000

#: Kernels the backend's own loop emitter generates (not a library's): where
#: a device prices loop-emitted reductions apart (XLA:CPU), these pay it.
_LOOP_EMITTED = frozenset({KernelKind.LOOP_FUSION, KernelKind.INPUT_FUSION,
                           KernelKind.OUTPUT_FUSION, KernelKind.UNFUSED_OP})

#: Findings about memory capacity, not time: ranked apart, by peak saved.
CAPACITY_KINDS = frozenset({FindingKind.UNDONATED_ARGUMENT, FindingKind.REMAT_CANDIDATE,
                            FindingKind.REPLICATED_BUFFER})


class Bound(enum.Enum):
  """What limits a kernel's estimated time."""

  MEMORY = "memory"
  COMPUTE = "compute"
  LAUNCH = "launch"
  COMMUNICATION = "communication"


@dataclasses.dataclass(frozen=True, slots=True)
class KernelTime:
  """One kernel's estimate: per launch, and launches per step."""

  name: str
  #: Bytes one launch moves (reads + writes, without library scratch).
  bytes: int
  #: FLOPs of one launch on the matrix unit and on the vector unit.
  matrix_flops: int
  vector_flops: int
  transcendentals: int
  #: Launches per step (the trip counts of enclosing loops; 1 when unknown).
  launches: int
  #: Seconds of one launch: memory, compute, launch overhead, communication.
  memory_time: float
  compute_time: float
  launch_time: float
  communication_time: float = 0.0
  #: Whether it runs beside other kernels (an asynchronous collective).
  overlapped: bool = False
  #: How it touches memory (`work.Work`): out of order, the elements its
  #: reductions read, split over threads.
  strided: bool = False
  reduce_elements: int = 0
  parallel: bool = False
  #: How its largest dot reads its operands ("nn", "nt", "tn", "tt"; "").
  orientation: str = ""
  #: Which of the backend's dot implementations prices it (`matrix_variant`).
  variant: str = ""
  #: Bytes one launch reads and writes in on-chip memory spaces (a TPU's
  #: VMEM): not in `bytes`, which is main memory's traffic.
  on_chip_bytes: int = 0
  #: Bytes its gathers and scatters move in whole blocks, one index at a
  #: time (`DeviceFacts.index_block`), beyond `bytes`.
  indexed_bytes: int = 0

  @property
  def time_per_launch(self) -> float:
    if self.communication_time:
      return self.communication_time + self.launch_time
    return max(self.memory_time, self.compute_time) + self.launch_time

  @property
  def time(self) -> float:
    """Seconds per step, every launch."""
    return self.time_per_launch * self.launches

  @property
  def bound(self) -> Bound:
    if self.communication_time:
      return Bound.COMMUNICATION
    work = max(self.memory_time, self.compute_time)
    if self.launch_time >= work:
      return Bound.LAUNCH
    return Bound.MEMORY if self.memory_time >= self.compute_time else Bound.COMPUTE

  @property
  def flops(self) -> int:
    return self.matrix_flops + self.vector_flops

  @property
  def intensity(self) -> float:
    """FLOPs per byte moved (0 for a kernel that moves nothing)."""
    return self.flops / self.bytes if self.bytes else 0.0

  def to_dict(self) -> dict:
    return {"name": self.name, "bytes": self.bytes, "matrix_flops": self.matrix_flops,
            "vector_flops": self.vector_flops, "transcendentals": self.transcendentals,
            "launches": self.launches, "memory_time": self.memory_time,
            "compute_time": self.compute_time, "launch_time": self.launch_time,
            "communication_time": self.communication_time, "overlapped": self.overlapped,
            "strided": self.strided, "reduce_elements": self.reduce_elements,
            "parallel": self.parallel, "orientation": self.orientation,
            "variant": self.variant, "on_chip_bytes": self.on_chip_bytes,
            "indexed_bytes": self.indexed_bytes, "time": self.time, "bound": self.bound.value,
            "intensity": self.intensity}


@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
  """One bar of the estimated timeline."""

  kernel: str
  #: Seconds from the step's start.
  start: float
  duration: float
  #: "compute" (the kernels' stream) or "communication".
  track: str = "compute"
  #: Launches this bar stands for (a folded loop's iterations).
  count: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class StepTime:
  """The estimated step on one device: every kernel, the total, its split."""

  facts: DeviceFacts
  #: Every kernel's estimate, in schedule order.
  kernels: tuple[KernelTime, ...]
  #: Seconds of one step along the schedule.
  step_time: float
  #: The step split by what bounds its time; they sum to `step_time`.
  memory_time: float
  compute_time: float
  launch_time: float
  #: Communication the kernels do not hide.
  communication_time: float
  #: Communication hidden under kernels (not in the step).
  overlapped_communication: float = 0.0
  #: What the model assumed for this program, in words.
  assumptions: tuple[str, ...] = ()
  #: The timeline, launch by launch (loops folded beyond MAX_EVENTS).
  launches: tuple[Launch, ...] = dataclasses.field(default=(), compare=False, repr=False)
  _by_name: Mapping[str, KernelTime] = dataclasses.field(
      default_factory=dict, compare=False, repr=False)

  def kernel(self, name: str) -> KernelTime | None:
    return self._by_name.get(name)

  def share(self, seconds: float | None) -> float | None:
    """`seconds` as a fraction of the step (None when unknown)."""
    if seconds is None or not self.step_time:
      return None
    return seconds / self.step_time

  @property
  def split(self) -> Mapping[str, float]:
    return {"memory": self.memory_time, "compute": self.compute_time,
            "launch": self.launch_time, "communication": self.communication_time}

  def to_dict(self) -> dict:
    return {"step_time": self.step_time, "split": dict(self.split),
            "overlapped_communication": self.overlapped_communication,
            "assumptions": list(self.assumptions), "device": self.facts.to_dict(),
            "kernels": [k.to_dict() for k in self.kernels]}

  @classmethod
  def from_dict(cls, d: Mapping) -> StepTime:
    """The inverse of `to_dict`, without the timeline (a report read from
    JSON)."""
    kernels = tuple(KernelTime(**{f.name: k[f.name] for f in dataclasses.fields(KernelTime)
                                  if f.name in k}) for k in d.get("kernels", ()))
    split = d.get("split", {})
    return cls(facts=DeviceFacts.from_dict(d["device"]), kernels=kernels,
               step_time=float(d["step_time"]), memory_time=float(split.get("memory", 0.0)),
               compute_time=float(split.get("compute", 0.0)),
               launch_time=float(split.get("launch", 0.0)),
               communication_time=float(split.get("communication", 0.0)),
               overlapped_communication=float(d.get("overlapped_communication", 0.0)),
               assumptions=tuple(d.get("assumptions", ())),
               _by_name=types.MappingProxyType({k.name: k for k in kernels}))


# -------------------------------------------------------------- kernels ----


def kernel_times(program: Program, facts: DeviceFacts) -> dict[str, KernelTime]:
  """Every kernel's estimate, by name."""
  from hlo_audit._src.analysis.collectives import find_collectives

  module = program.module
  sent = {c.name: c for c in find_collectives(program)}
  cache: dict = {}
  out = {}
  for k in program.kernels.values():
    comp = program.comps.get(k.computation)
    inst = comp.instruction(k.name) if comp is not None and k.name in comp else None
    if inst is None:
      work = NO_WORK
      on_chip = 0
    else:
      members = k.members if k.kind is KernelKind.PALLAS and k.members else ()
      work = kernel_work(module, comp, inst, members, cache)
      on_chip = _on_chip_bytes(program, inst)
    out[k.name] = price_kernel(k, work, facts, sent.get(k.name), on_chip_bytes=on_chip)
  return out


def _on_chip_bytes(program: Program, inst) -> int:
  """Bytes `inst` reads from and writes to buffers outside main memory (a
  TPU's VMEM, semaphores): its operands' values and the values it defines,
  tiled, less what main memory holds of them."""
  dataflow = program.dataflow
  values, holds = dataflow.values, dataflow.holds
  total = 0
  for operand in inst.operands:
    for _, v in holds.get(operand, ()):
      value = values[v]
      total += value.shape.physical_byte_size - value.byte_size
  for _, v in holds.get(inst.name, ()):
    if v[0] == inst.name:
      value = values[v]
      total += value.shape.physical_byte_size - value.byte_size
  return total


def price_kernel(k: Kernel, work: Work, facts: DeviceFacts, collective=None, *,
                 on_chip_bytes: int = 0) -> KernelTime:
  """One kernel's estimate from its bytes and work (`collective`: its
  `collectives.Collective` row, for communication; `on_chip_bytes`: what it
  moves outside main memory)."""
  moved = max(0, k.bytes_read + k.bytes_written - work.scratch_bytes)
  variant = matrix_variant(k, work)
  comm = 0.0
  overlapped = False
  indexed = sum(facts.indexed_bytes(a) for a in work.indexed)
  if collective is not None:
    link = facts.link_bandwidth or facts.memory_bandwidth
    comm = (collective.bytes_sent / link if link else 0.0) + facts.collective_latency
    overlapped = collective.is_async
    memory = compute = 0.0
  else:
    rate = facts.bandwidth(moved)
    if work.strided and facts.strided_bandwidth:
      rate = min(rate, facts.strided_bandwidth)
    memory = moved / rate if rate else 0.0
    if on_chip_bytes and facts.on_chip_bandwidth:
      memory += on_chip_bytes / facts.on_chip_bandwidth
    if indexed and facts.memory_bandwidth:
      # One index after another, each a whole block: no streaming overlap.
      memory += indexed / facts.memory_bandwidth
    compute = 0.0
    narrow = facts.contraction_efficiency(work.narrowest, variant)
    for element, flops in work.matrix_flops.items():
      r = facts.matrix_rate(element, variant) * narrow
      compute += flops / r if r else 0.0
    vec = facts.vector_rate("f32")
    vector = work.vector_flops
    # Where the device prices reductions apart (XLA:CPU), the elements they
    # read set the pace, not their FLOPs: one at a time in a loop-emitted
    # kernel, at the library's rate in a library's.
    rate = (facts.loop_reduction_rate if k.kind in _LOOP_EMITTED else
            facts.reduction_rate if k.kind is KernelKind.CPU_LIBRARY_FUSION else 0.0)
    if rate and work.reduce_elements:
      vector = max(0, vector - work.reduce_elements)
      compute += work.reduce_elements / rate
    compute += vector / vec if vec else 0.0
    if facts.transcendentals_per_second:
      compute += work.transcendentals / facts.transcendentals_per_second
  matrix = sum(work.matrix_flops.values())
  return KernelTime(
      name=k.name, bytes=moved, matrix_flops=matrix, vector_flops=work.vector_flops,
      transcendentals=work.transcendentals, launches=k.trip_count or 1,
      memory_time=memory, compute_time=compute,
      launch_time=0.0 if collective is not None else (
          facts.launch_overhead + (facts.parallel_overhead if work.parallel else 0.0)),
      communication_time=comm, overlapped=overlapped, strided=work.strided,
      reduce_elements=work.reduce_elements, parallel=work.parallel,
      orientation=work.orientation, variant=variant, on_chip_bytes=on_chip_bytes,
      indexed_bytes=indexed if collective is None else 0)


def matrix_variant(k: Kernel, work: Work) -> str:
  """Which of the backend's dot implementations runs the kernel's dots (see
  `DeviceFacts.matrix_variants`): "plain" where the backend emits the dot
  itself (XLA:CPU's Eigen dots: an unfused dot, a dot in a loop fusion),
  "nt" for a library's dot of a transposed right operand, else ""."""
  if not work.matrix_flops:
    return ""
  if k.kind in _LOOP_EMITTED:
    return "plain"
  return "nt" if work.orientation in ("nt", "tt") else ""


# ----------------------------------------------------------------- step ----


@dataclasses.dataclass(slots=True)
class _Segment:
  """A computation walked once: its duration and split, its launches
  relative to its start."""

  duration: float = 0.0
  split: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
      ("memory", "compute", "launch", "communication"), 0.0))
  overlapped: float = 0.0
  events: list = dataclasses.field(default_factory=list)
  #: Launches `events` stands for (a folded loop counts its iterations).
  count: int = 0

  def add(self, other: _Segment, times: int = 1) -> None:
    self.duration += other.duration * times
    for key, v in other.split.items():
      self.split[key] += v * times
    self.overlapped += other.overlapped * times


class _Walker:
  """Walks XLA's schedule, computation by computation (each once: a loop
  body's iterations are alike in the model)."""

  def __init__(self, program: Program, costs: Mapping[str, KernelTime]):
    from hlo_audit._src.analysis.collectives import find_collectives

    self.program = program
    self.costs = costs
    self.done_of: dict[str, str] = {}
    self.start_of_done: dict[str, str] = {}
    for c in find_collectives(program):
      if c.is_async:
        self.done_of[c.name] = c.done
        self.start_of_done[c.done] = c.name
    self.grouped = {m for k in program.kernels.values()
                    if k.kind is KernelKind.PALLAS for m in k.members} - set(costs)
    self.memo: dict[str, _Segment] = {}
    self.notes: set[str] = set()
    self.budget = MAX_EVENTS

  def walk(self, name: str) -> _Segment:
    hit = self.memo.get(name)
    if hit is not None:
      return hit
    self.memo[name] = _Segment()  # a cycle (malformed input) adds nothing
    comp = self.program.module.computation(name)
    seg = _Segment()
    clock = 0.0
    comm_free = 0.0  # when the communication stream is next free
    ends: dict[str, float] = {}
    for inst in comp.instructions:
      k = self.costs.get(inst.name)
      if k is not None:
        t = k.time_per_launch
        if k.overlapped:
          start = max(clock, comm_free)
          comm_free = ends[inst.name] = start + t
          seg.events.append(Launch(inst.name, start, t, "communication"))
          seg.count += 1
          continue
        seg.events.append(Launch(inst.name, clock, t))
        seg.count += 1
        clock += t
        if k.communication_time:
          seg.split["communication"] += t
        else:
          seg.split["launch"] += k.launch_time
          work = t - k.launch_time
          seg.split["memory" if k.memory_time >= k.compute_time else "compute"] += work
        continue
      if inst.name in self.grouped:
        continue  # inside a grouped (interpreted Pallas) kernel
      start = self.start_of_done.get(inst.name)
      if start is not None and start in ends:
        hidden_until = ends.pop(start)
        comm = self.costs[start].time_per_launch
        exposed = max(0.0, hidden_until - clock)
        seg.split["communication"] += exposed
        seg.overlapped += comm - exposed
        clock += exposed
        continue
      if inst.opcode == "while":
        called = inst.called_computations
        trip = bt.trip_count(inst)
        if trip is None:
          trip = 1
          self.notes.add("a while loop states no trip count: its body is counted once")
        clock = self._repeat(seg, clock, [*called.get("condition", ()),
                                          *called.get("body", ())], trip)
      elif inst.opcode == "conditional":
        branches = [self.walk(b) for b in inst.called_computation_names()
                    if b in self.program.module]
        if branches:
          longest = max(branches, key=lambda s: s.duration)
          if len(branches) > 1:
            self.notes.add("a conditional is charged its longest branch")
          clock = self._place(seg, clock, longest, 1)
      elif inst.opcode in ("call", "async-start"):
        for callee in inst.called_computation_names():
          if callee in self.program.module:
            clock = self._place(seg, clock, self.walk(callee), 1)
    # Communication still running when the computation ends is exposed.
    if ends:
      last = max(ends.values())
      if last > clock:
        seg.split["communication"] += last - clock
        clock = last
    seg.duration = clock
    self.memo[name] = seg
    return seg

  def _repeat(self, seg: _Segment, clock: float, comps: Sequence[str], trip: int) -> float:
    parts = [self.walk(c) for c in comps if c in self.program.module]
    one = _Segment()
    for p in parts:
      offset = one.duration
      one.add(p)
      one.events.extend(dataclasses.replace(e, start=e.start + offset) for e in p.events)
      one.count += p.count
    return self._place(seg, clock, one, trip)

  def _place(self, seg: _Segment, clock: float, part: _Segment, times: int) -> float:
    """`part` run `times` times from `clock`: its launches listed while the
    budget lasts, then folded."""
    seg.add(part, times)
    if part.count * times <= self.budget:
      for i in range(times):
        base = clock + i * part.duration
        seg.events.extend(dataclasses.replace(e, start=e.start + base) for e in part.events)
      self.budget -= part.count * times
      seg.count += part.count * times
    else:
      # Folded: each launch of one iteration stands for all of them.
      seg.events.extend(dataclasses.replace(e, start=clock + e.start * times,
                                            duration=e.duration * times,
                                            count=e.count * times) for e in part.events)
      seg.count += part.count
      self.notes.add(f"the timeline folds loops beyond {MAX_EVENTS} launches: one bar "
                     "per kernel for all its iterations")
    return clock + part.duration * times


def estimate(program: Program, facts: DeviceFacts) -> StepTime:
  """The program's step on the device `facts` describe."""
  costs = kernel_times(program, facts)
  walker = _Walker(program, costs)
  seg = walker.walk(program.module.entry_name)
  assumptions = [
      "kernels run one at a time in XLA's schedule; asynchronous collectives "
      "overlap the kernels scheduled between their start and done",
      "each kernel moves its bytes once at the bandwidth of the smallest cache "
      "holding them (no reuse across kernels beyond that)",
  ]
  if facts.platform == "cpu":
    assumptions.append("XLA:CPU may run independent kernels at once on its threads; "
                       "the model runs them one after another")
  if any(k.kind is KernelKind.PALLAS for k in program.kernels.values()):
    assumptions.append("Pallas kernels are priced by their bytes and the HLO ops "
                       "they hold (an interpreted kernel runs far slower)")
  if any(k.kind is KernelKind.CUSTOM_CALL for k in program.kernels.values()):
    assumptions.append("opaque custom calls are priced by their bytes alone")
  assumptions.extend(sorted(walker.notes))
  ordered = tuple(costs[k] for k in program.kernels)
  return StepTime(
      facts=facts, kernels=ordered, step_time=seg.duration,
      memory_time=seg.split["memory"], compute_time=seg.split["compute"],
      launch_time=seg.split["launch"], communication_time=seg.split["communication"],
      overlapped_communication=seg.overlapped, assumptions=tuple(assumptions),
      launches=tuple(seg.events), _by_name=types.MappingProxyType(costs))


# ------------------------------------------------------------- findings ----


def time_saved(f: FusionDecisionRecord, step: StepTime) -> float | None:
  """Estimated seconds per step the finding's change saves (negative: it
  costs time, as a remat's recompute does); None where it has no time effect
  the model prices (a capacity change without one)."""
  kind = f.kind
  if kind in (FindingKind.KEEP_REUSE, FindingKind.ALREADY_FUSED):
    return 0.0
  if kind in (FindingKind.UNDONATED_ARGUMENT, FindingKind.REPLICATED_BUFFER):
    return 0.0  # capacity: the same kernels run
  if kind is FindingKind.REMAT_CANDIDATE:
    k = step.kernel(f.producer)
    return -k.time_per_launch if k is not None else None
  if kind is FindingKind.COSTLY_REMAT:
    names = (f.producer, *f.consumers)
    return sum(k.time for k in map(step.kernel, names) if k is not None)
  if kind is FindingKind.EXPOSED_COLLECTIVE:
    k = step.kernel(f.producer)
    return k.time if k is not None else None
  if kind is FindingKind.COLLECTIVE_MATMUL:
    k = step.kernel(f.producer)
    if k is None:
      return None
    dots = [step.kernel(c) for c in f.consumers]
    hide = sum(d.time for d in dots if d is not None)
    return min(k.time, hide) if hide else 0.0
  if kind is FindingKind.RESHARD_AROUND_COLLECTIVE:
    # The copy goes (the boundary names it); the collective stays.
    k = step.kernel(f.boundary)
    return k.time if k is not None else None
  if kind is FindingKind.LOOP_INVARIANT:
    k = step.kernel(f.producer)
    if k is None:
      return None
    repeats = (f.trip_count - 1) if f.trip_count else 1
    return k.time_per_launch * repeats
  return _fusion_saving(f, step)


def _fusion_saving(f: FusionDecisionRecord, step: StepTime) -> float | None:
  """The named kernels before, minus one fused kernel after: their bytes less
  the boundary's traffic, their work, the launches left."""
  names = list(dict.fromkeys(n for n in (f.producer, *f.consumers) if n))
  kernels = [k for k in map(step.kernel, names) if k is not None]
  facts = step.facts
  if not kernels:
    # No kernel of ours (a parameter's boundary): the traffic alone.
    rate = facts.bandwidth(f.bytes_saved)
    return (f.bytes_saved / rate if rate else 0.0) + \
        f.launches_removed * facts.launch_overhead
  before = sum(k.time for k in kernels)
  memory = sum(k.memory_time * k.launches for k in kernels)
  compute = sum(k.compute_time * k.launches for k in kernels)
  launches = sum(k.launches for k in kernels)
  # The boundary's traffic, at the rate its buffer streams at.
  trips = f.trip_count or 1
  per_trip = f.bytes_saved // trips if trips else f.bytes_saved
  rate = facts.bandwidth(per_trip)
  removed = f.bytes_saved / rate if rate else 0.0
  after_memory = max(0.0, memory - removed)
  left = max(0, launches - f.launches_removed)
  after = max(after_memory, compute) + left * facts.launch_overhead
  return max(0.0, before - after)


def price_findings(findings: Iterable[FusionDecisionRecord],
                   step: StepTime) -> tuple[FusionDecisionRecord, ...]:
  """`findings` with `time_saved` filled in."""
  return tuple(with_changes(f, time_saved=time_saved(f, step)) for f in findings)


def step_after(step: StepTime, findings: Sequence[FusionDecisionRecord]) -> float:
  """The estimated step once `findings` are fixed, each boundary once."""
  best: dict[str, float] = {}
  for f in findings:
    key = f.boundary or f"{f.producer}:{f.kind.slug}"
    t = f.time_saved if f.time_saved is not None else time_saved(f, step)
    if t is not None:
      best[key] = max(best.get(key, t), t)
  return max(0.0, step.step_time - sum(best.values()))
