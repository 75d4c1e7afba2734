"""What-if replays: the peak after a change the user can make.

A replay runs the liveness analysis again (XLA's BufferAssigner and heap, see
liveness.py) on the program a change would produce, described as edits of the
original's buffers rather than by recompiling:

- fuse a finding: its boundary buffer is never written; the fused kernel runs
  where the last consumer ran, so the producer's inputs live until then.
- donate an argument: the module gains the `input_output_alias` entries JAX
  would add (each donated leaf aliased to the first free output of the same
  shape and dtype, in order), and dataflow and liveness run on that module.
- remat a buffer: it is kept until its first group of uses only; before the
  later group (the backward pass) it is recomputed, a temporary living from
  the first of those uses to the last, and its producer's inputs stay live
  until then (as `jax.checkpoint` would do).
- drop a buffer: it is gone (an upper bound on what removing it can give).
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import re
import types
from collections.abc import Iterable, Mapping, Sequence

from hlo_audit._src.analysis.dataflow import Dataflow, ValueId, with_output_aliases
from hlo_audit._src.analysis.liveness import Liveness, LivenessEdits, analyze_liveness
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.hlo.ir import HloModule, Instruction, ModuleAlias


class WhatIfError(HloAuditError, ValueError):
  """A what-if naming a buffer, argument or finding the program lacks."""


@dataclasses.dataclass(frozen=True, slots=True)
class Argument:
  """One array leaf of a jitted function's arguments, as JAX passes it."""

  #: Entry parameter number in the HLO.
  parameter: int
  #: Pytree path, e.g. "params['dense']['kernel']".
  path: str
  #: Positional argument it belongs to (None: keyword-only or unknown).
  argnum: int | None = None
  #: Name of that argument in the function's signature, when known.
  argname: str | None = None


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

  @property
  def peak_saved(self) -> int:
    return self.baseline_peak_bytes - self.peak_bytes

  def to_dict(self) -> dict:
    return {"changes": list(self.changes),
            "baseline_peak_bytes": self.baseline_peak_bytes,
            "peak_bytes": self.peak_bytes, "peak_saved": self.peak_saved,
            "peak_time": self.peak_time, "live_at_peak": list(self.live_at_peak),
            "baseline_timeline": list(self.baseline_timeline),
            "timeline": list(self.timeline), "notes": list(self.notes)}

  def __str__(self) -> str:
    from hlo_audit._src.report.what_if_text import render_what_if

    return render_what_if(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
  """What a replay needs of the audited program."""

  module: HloModule
  schedule: Schedule
  dataflow: Dataflow
  liveness: Liveness
  arguments: tuple[Argument, ...] = ()
  #: Tables quick replays share (filled on first use).
  cache: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
  #: The backend that compiled it ("gpu", "cpu", ""): whose buffer-sharing
  #: rules replays follow.
  platform: str = ""


# ---------------------------------------------------------------- naming ----


def arguments_of(module: HloModule, argument_names: Sequence[str]) -> tuple[Argument, ...]:
  """The entry parameters as the user's arguments: the pytree path JAX writes
  in each parameter's `op_name`, and the argument number its leading name has
  in the function's signature (`argument_names`, "*args" for var-positional)."""
  out = []
  star = next((i for i, n in enumerate(argument_names) if n.startswith("*")), None)
  for p in module.entry.parameters:
    path = p.metadata.op_name or p.name
    head = re.match(r"[A-Za-z_][A-Za-z_0-9]*", path)
    name = head.group(0) if head else None
    argnum = None
    if name is not None and name in argument_names:
      argnum = argument_names.index(name)
    elif star is not None and name == argument_names[star][1:]:
      index = re.match(r"\[(\d+)\]", path[len(name):])
      if index:
        argnum, name = star + int(index.group(1)), None
    out.append(Argument(parameter=p.parameter_number, path=path, argnum=argnum,
                        argname=name if argnum is not None else None))
  return tuple(out)


def buffer_name(vid: ValueId) -> str:
  """A buffer's display name, as the report's Buffer rows spell it."""
  return vid[0] + ("{" + ",".join(map(str, vid[1])) + "}" if vid[1] else "")


def _parse_buffer_name(name: str) -> ValueId:
  if name.endswith("}") and "{" in name:
    inst, _, idx = name[:-1].partition("{")
    try:
      return inst, tuple(int(i) for i in idx.split(",") if i.strip())
    except ValueError:
      raise WhatIfError(f"bad buffer name {name!r}: expected NAME or NAME{{i,j}}") from None
  return name, ()


def find_buffer(dataflow: Dataflow, name: str) -> ValueId | None:
  """The buffer holding the value `name` ("fusion.3" or "fusion.3{1}"), or
  None (a tuple-shaped instruction named without its index: its only leaf)."""
  try:
    vid = _parse_buffer_name(name)
  except WhatIfError:
    return None
  if vid not in dataflow.values:
    if vid[1]:
      return None
    leaves = [i for i, _ in dataflow.holds.get(vid[0], ()) if i != ()]
    if len(leaves) != 1 or (vid[0], leaves[0]) not in dataflow.values:
      return None
    vid = (vid[0], leaves[0])
  return dataflow.buffer_of[vid]


def resolve_buffer(dataflow: Dataflow, name: str) -> ValueId:
  """`find_buffer`, or an error naming the closest buffers.

  Raises:
    WhatIfError: when the program has no such value.
  """
  _parse_buffer_name(name)  # a malformed name says so
  found = find_buffer(dataflow, name)
  if found is None:
    names = [buffer_name(b) for b in dataflow.buffers]
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise WhatIfError(f"no buffer {name!r} in the program{hint}")
  return found


def parameter_paths(module: HloModule) -> Mapping[int, str]:
  """Entry parameter number -> the argument path JAX wrote in its metadata
  (`op_name`), or the parameter's name when there is none."""
  return module._cached("parameter_paths", lambda: types.MappingProxyType({
      p.parameter_number: (p.metadata.op_name or p.name)
      for p in module.entry.parameters}))


def _under_path(module: HloModule, spec: str) -> list[int]:
  """Parameters whose path is `spec` or lies under it (`spec[...]`,
  `spec.x`), in path order: a bisection of the sorted paths, since a
  donation replay resolves every leaf's path by itself."""
  ordered = module._cached("sorted_parameter_paths", lambda: sorted(
      (path, n) for n, path in parameter_paths(module).items()))
  found = []
  for prefix, whole in ((spec, True), (spec + "[", False), (spec + ".", False)):
    i = bisect.bisect_left(ordered, (prefix,))
    while i < len(ordered) and (ordered[i][0] == prefix if whole
                                else ordered[i][0].startswith(prefix)):
      found.append(ordered[i][1])
      i += 1
  return found


def resolve_arguments(program: Program, specs: Iterable[int | str]) -> list[int]:
  """Entry parameter numbers named by `specs`: argument numbers (when the
  capture knows them), argument names or pytree paths (a prefix path names
  every leaf under it, e.g. "params" or "params['dense']"), or HLO parameter
  names.

  Raises:
    WhatIfError: for a spec naming no parameter.
  """
  paths = parameter_paths(program.module)
  names = program.module._cached("parameter_numbers", lambda: {
      p.name: p.parameter_number for p in program.module.entry.parameters})
  out: list[int] = []
  for spec in specs:
    found: list[int] = []
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
      n = int(spec)
      if not program.arguments:
        raise WhatIfError(
            f"donate={n}: argument numbers need the jitted function's arguments "
            "(audit(fn, *args)); name the argument or its path instead, e.g. "
            + ", ".join(repr(p) for p in list(paths.values())[:3]))
      found = [a.parameter for a in program.arguments if a.argnum == n]
    else:
      spec = spec.strip()
      if spec in names:
        found = [names[spec]]
      else:
        found = _under_path(program.module, spec)
        found += [a.parameter for a in program.arguments
                  if a.argname == spec and a.parameter not in found]
    if not found:
      heads = {re.split(r"[\[.]", p, maxsplit=1)[0] for p in paths.values()}
      close = difflib.get_close_matches(str(spec), sorted(heads) + list(paths.values()), n=3)
      hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
      raise WhatIfError(f"donate: no argument {spec!r} in the program{hint}")
    out.extend(n for n in sorted(found) if n not in out)
  return out


# ------------------------------------------------------------- donation ----


def donation_aliases(module: HloModule, dataflow: Dataflow,
                     parameters: Sequence[int]) -> list[tuple[tuple[int, ...], int]]:
  """(output index, parameter) pairs JAX's donation would add: each donated
  parameter, in order, takes the first output of its shape and dtype not
  aliased already and not itself a parameter passed through."""
  entry = module.entry
  root = entry.instruction(entry.root_name)
  taken = {a.output_index for a in module.input_output_alias}
  already = {a.parameter for a in module.input_output_alias}
  params = {p.parameter_number: p for p in entry.parameters}
  outputs = []
  for index, vid in dataflow.holds.get(root.name, ()):
    inst = entry.instruction(vid[0]) if vid[0] in entry else None
    if inst is not None and inst.opcode == "parameter":
      continue  # an argument returned as is: JAX does not alias it
    leaf = root.shape.subshape(index)
    outputs.append((index, (leaf.element_type, tuple(leaf.dims))))
  pairs = []
  for n in parameters:
    p = params[n]
    if n in already or p.shape is None or p.shape.is_tuple:
      continue
    key = (p.shape.element_type, tuple(p.shape.dims))
    for index, okey in outputs:
      if okey == key and index not in taken:
        taken.add(index)
        pairs.append((index, n))
        break
  return pairs


def with_donation(module: HloModule, pairs: Sequence[tuple[tuple[int, ...], int]]) -> HloModule:
  """`module` with `input_output_alias` entries for `pairs` added."""
  entries = [f"{{{','.join(map(str, a.output_index))}}}: ({a.parameter}, "
             f"{{{','.join(map(str, a.parameter_index))}}}, "
             f"{'must-alias' if a.must_alias else 'may-alias'})"
             for a in module.input_output_alias]
  entries += [f"{{{','.join(map(str, index))}}}: ({n}, {{}}, may-alias)"
              for index, n in pairs]
  attributes = dict(module.attributes)
  attributes["input_output_alias"] = "{ " + ", ".join(entries) + " }"
  donated = dataclasses.replace(module, attributes=types.MappingProxyType(attributes))
  # The entries as parsed, so that no reader lexes the text just written.
  aliases = module.input_output_alias + tuple(
      ModuleAlias(output_index=tuple(index), parameter=n, parameter_index=())
      for index, n in pairs)
  donated._cached("input_output_alias", lambda: aliases)
  return donated


def aliasing_copies(module: HloModule, dataflow: Dataflow, schedule: Schedule,
                    pairs: Sequence[tuple[tuple[int, ...], int]]
                    ) -> list[tuple[int, int, int, int]]:
  """The copies XLA's copy insertion adds for donated parameters, as
  (parameter, first, last, bytes): a donated parameter read by an instruction
  that is neither the aliased output's writer nor one of its dataflow
  ancestors may run after the output overwrote it, so XLA copies the
  parameter and every read takes the copy. The scheduler puts such copies
  first, so a copy lives from the entry's first step after its parameters
  and constants to the parameter's last read, and the parameter itself only
  until the copy."""
  entry = module.entry
  root = entry.instruction(entry.root_name)
  out_value = dict(dataflow.holds.get(root.name, ()))
  params = {p.parameter_number: p for p in entry.parameters}
  time = schedule.time
  readers_of = {n: [u for u, _ in dataflow.uses.get((params[n].name, ()), ())]
                for _, n in pairs if n in params}
  # Which of those readers each instruction depends on, as bits: one pass in
  # text order (operands and control predecessors come first), not a search
  # of the entry per output.
  bit = {u: 1 << k for k, u in enumerate(dict.fromkeys(
      u for readers in readers_of.values() for u in readers if u in entry))}
  reach: dict[str, int] = {}
  if bit:
    for inst in entry.instructions:
      found = 0
      for o in (*inst.operands, *inst.control_predecessors):
        found |= reach.get(o, 0) | bit.get(o, 0)
      reach[inst.name] = found
  first = min((time[i.name] for i in entry.instructions
                if i.opcode not in ("parameter", "constant") and i.name in time),
               default=0)
  out = []
  for index, n in pairs:
    p = params[n]
    writer = out_value[index][0]
    if writer not in entry:
      continue
    readers = readers_of[n]
    before = reach.get(writer, 0)
    if all(u in entry and (u == writer or bit[u] & before) for u in readers):
      continue
    times = [time[u] for u in readers if u in time]
    if times:
      out.append((n, min(first, min(times)), max(times), p.shape.byte_size))
  return out


# --------------------------------------------------------------- replay ----


def replay(program: Program, *, fuse: Sequence[tuple[str, str, Sequence[str]]] = (),
           donate: Sequence[int | str] = (), remat: Sequence[str] = (),
           drop: Sequence[str] = (), quick: bool = False) -> WhatIf | int:
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

  Raises:
    WhatIfError: for a name the program lacks.
  """
  module, schedule, dataflow = program.module, program.schedule, program.dataflow
  base = program.liveness
  changes: list[str] = []
  notes: list[str] = []
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
    copies = aliasing_copies(module, dataflow, schedule, pairs)
    for n, _, _, size in copies:
      notes.append(f"XLA copies {paths[n]} ({size} B): a read of it is not "
                   "ordered before the write of its aliased output")
    if pairs:
      module = with_donation(module, pairs)
      dataflow = with_output_aliases(dataflow, module, [(i, n, ()) for i, n in pairs])
  base_ranges = base.value_ranges
  time = schedule.time
  dropped: set[ValueId] = set()
  ranges: dict[ValueId, tuple[int, int]] = {}
  extra: list[tuple[int, int, int]] = []
  if donate:
    entry_params = {p.parameter_number: p.name for p in module.entry.parameters}
    for n, first, last, size in copies:
      extra.append((first, last, size))
      # Only the copy is read: the parameter's memory is free until the
      # output is written into it.
      ranges[(entry_params[n], ())] = (base_ranges[(entry_params[n], ())][0], first)

  def value_range(v: ValueId) -> tuple[int, int]:
    return ranges.get(v, base_ranges[v])

  def keep_inputs_until(inst_name: str, t: int) -> None:
    inst = _instruction(module, schedule, inst_name)
    if inst is None:
      return
    for operand in inst.operands:
      for _, v in dataflow.holds.get(operand, ()):
        if v in base_ranges:
          s, e = value_range(v)
          if e < t:
            ranges[v] = (s, t)

  for name in drop:
    dropped.add(resolve_buffer(dataflow, name))
    changes.append(f"drop {name}")
  for boundary, producer, consumers in fuse:
    b = resolve_buffer(dataflow, boundary)
    dropped.add(b)
    last = max((time[c] for c in consumers if c in time), default=None)
    if last is not None and producer:
      keep_inputs_until(producer, last)
    changes.append(f"fuse {boundary} ({producer or 'input'} -> "
                   f"{', '.join(consumers) or '?'})")
  for name in remat:
    b = resolve_buffer(dataflow, name)
    members = dataflow.buffers[b]
    if len(members) != 1:
      raise WhatIfError(f"remat {name!r}: the buffer is shared by {len(members)} "
                        "values (loop state or an alias); only a plain value can "
                        "be recomputed")
    split = remat_split(dataflow, schedule, base_ranges, b)
    if split is None:
      notes.append(f"remat {name}: its uses form one group; nothing to recompute")
      continue
    kept_last, again_first, again_last = split
    ranges[b] = (value_range(b)[0], kept_last)
    extra.append((again_first, again_last, dataflow.buffer_bytes(b)))
    keep_inputs_until(b[0], again_first)
    changes.append(f"remat {name}")
  edits = LivenessEdits(dropped=frozenset(dropped),
                        value_ranges=types.MappingProxyType(ranges), extra=tuple(extra))
  if quick:
    if donate:
      raise WhatIfError("a quick replay keeps the buffer assignment: donation changes it")
    return quick_peak(program, edits)
  # Tables shared between replays (a donated program's derived from them).
  after = analyze_liveness(module, schedule, dataflow, edits, cache=program.cache,
                           platform=program.platform)
  return WhatIf(
      changes=tuple(changes), baseline_peak_bytes=base.peak_bytes,
      peak_bytes=after.peak_bytes, peak_time=after.peak_time,
      live_at_peak=tuple(buffer_name(b) for b in after.live_at_peak),
      baseline_timeline=base.timeline, timeline=after.timeline, notes=tuple(notes))


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
  heap (XLA:GPU's) keeps the program's fragmentation: only a full replay
  packs it again."""
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
  return total + int(line.max(initial=0)) + base.fragmentation_bytes


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


def _instruction(module: HloModule, schedule: Schedule, name: str) -> Instruction | None:
  for comp_name in schedule.span:
    comp = module.computation(comp_name)
    if name in comp:
      return comp.instruction(name)
  return None


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
  inst = _instruction(program.module, program.schedule, producer) if producer else None
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
  kept no longer can neither lower nor raise the peak (exact); the others
  get the quick replay (not exact): those that can move the peak get a full
  one later, the largest first, while the audit's budget lasts
  (`memory_findings.exact_peaks`)."""
  base = program.liveness
  out: list[tuple[int, bool] | None] = [None] * len(fusions)
  for k, fusion in enumerate(fusions):
    if fusion is None:
      continue
    b = find_buffer(program.dataflow, fusion[0])
    if b is None:
      continue
    if (not peak_mover_bytes(program, *fusion) and b in base.heap_buffers and
        not _inputs_may_raise_peak(program, *fusion)):
      out[k] = (base.peak_bytes, True)
    else:
      out[k] = (replay(program, fuse=[fusion], quick=True), False)
  return out
