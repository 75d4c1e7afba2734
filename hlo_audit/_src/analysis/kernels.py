"""Kernels: every top-level operation that launches work.

Walks the flattened schedule (the entry computation and, through while,
conditional, call and async bodies, everything they run), skipping what
launches nothing (parameters, constants, tuples, get-tuple-element, bitcasts,
control flow itself), and classifies each kernel by what launches it. A
kernel inside a loop body carries the loop's trip count when XLA states it.

Pallas kernels run in interpret mode (CPU) lower to a while loop and copies
of their own; the ops a kernel library launches sit under its named scope
(`pallas_kernels.<op>`), so those instructions, and the metadata-less copies
feeding only them, are reported as one kernel of kind PALLAS.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import types
from collections.abc import Callable, Mapping

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis import source as source_mod
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.dataflow import Dataflow, ValueId
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, SourceLocation


#: Opcodes that launch no kernel of their own.
_NO_LAUNCH = opcodes.NO_COMPUTE | {
    "while", "conditional", "call", "async-update", "async-done",
    "all-reduce-done", "all-gather-done", "collective-permute-done",
    "copy-done", "send-done", "recv-done"}


@dataclasses.dataclass(frozen=True, slots=True)
class Kernel:
  """One launch of work."""

  #: Instruction that launches it.
  name: str
  computation: str
  kind: KernelKind
  opcode: str
  #: What launches it, e.g. "__cublas$lt$matmul epilogue=BIAS_GELU",
  #: "__triton_gemm", "kLoop", "pallas_kernels.matmul".
  detail: str
  #: Opcodes inside (fusions, grouped Pallas kernels), with counts.
  fused_ops: Mapping[str, int]
  bytes_read: int
  bytes_written: int
  #: Times it runs per execution: product of enclosing trip counts; None
  #: when a loop around it has no known trip count.
  trip_count: int | None
  #: Position in the flattened schedule.
  time: int
  op_name: str
  source: SourceLocation | None
  #: For grouped kernels (interpreted Pallas): the member instructions.
  members: tuple[str, ...] = ()
  #: The stack `source` was chosen from, innermost frame first.
  source_stack: tuple[SourceLocation, ...] = ()
  #: On-chip memory (a TPU's VMEM) it reserves beyond its operands, bytes.
  on_chip_scratch: int = 0

  @property
  def bytes_moved(self) -> int:
    return self.bytes_read + self.bytes_written


def find_kernels(module: HloModule, schedule: Schedule, dataflow: Dataflow, *,
                 library_paths: tuple[str, ...] = source_mod.DEFAULT_LIBRARY_PATHS,
                 user_paths: tuple[str, ...] = source_mod.DEFAULT_USER_PATHS,
                 scopes: tuple[str, ...] = ()) -> tuple[Kernel, ...]:
  """Every kernel of `module`, in schedule order (`library_paths` and
  `user_paths` choose each kernel's source frame: `source.attribute`; the
  kernel libraries' `scopes`, e.g. "pallas_kernels.", group the instructions
  of one interpreted launch into one kernel)."""
  comps = {name: module.computation(name) for name in schedule.span}
  multiplicity = _multiplicity(module, comps)
  # Every scheduled instruction's op_name, read once (in text order, and by
  # name): the scopes' grouping scans them all, and each kernel keeps its own.
  names_of = {c: comp.op_names for c, comp in comps.items()}
  op_name_of = {c: dict(zip(map(_NAME, comp.instructions), names_of[c]))
                for c, comp in comps.items()}
  groups = _pallas_groups(module, comps, scopes, names_of) if scopes else {}
  grouped = {m: key for key, members in groups.items() for m in members}
  out: list[Kernel] = []
  emitted_groups: set[str] = set()
  # One attribution table and one value-size table for the whole walk.
  attribute = source_mod.attributor(module, library_paths, user_paths)
  sizes: dict[ValueId, int] = {}
  time = schedule.time
  for comp_name, name in schedule.sequence:
    comp = comps[comp_name]
    inst = comp.instruction(name)
    if name in grouped:
      key = grouped[name]
      if key not in emitted_groups:
        emitted_groups.add(key)
        out.append(_pallas_kernel(module, schedule, comps, dataflow, key,
                                  groups[key], multiplicity, attribute, scopes))
      continue
    if inst.opcode in _NO_LAUNCH:
      continue
    if inst.opcode == "custom-call" and inst.custom_call_target in bt.NO_OP_TARGETS:
      continue
    kind, detail, fused = _classify(module, inst)
    read, written = _io_bytes(module, comp, inst, dataflow, sizes, fused)
    src, stack = attribute(inst)
    out.append(Kernel(
        name=name, computation=comp_name, kind=kind, opcode=inst.opcode,
        detail=detail, fused_ops=types.MappingProxyType(fused),
        bytes_read=read, bytes_written=written,
        trip_count=multiplicity.get(comp_name, 1), time=time[name],
        op_name=op_name_of[comp_name][name], source=src, source_stack=stack,
        on_chip_scratch=bt.scoped_on_chip_bytes(inst)))
  return tuple(out)


def _classify(module: HloModule, inst: Instruction) -> tuple[KernelKind, str, dict]:
  op = inst.opcode
  if op == "fusion":
    kind, detail = bt.classify_fusion(inst)
    return kind, detail, fused_opcodes(module, inst)
  if op == "custom-call":
    target = inst.custom_call_target or ""
    user = bt.user_kernel_of(target)
    if user is not None:
      return KernelKind.PALLAS, f"{target} ({user})", {}
    lib = bt.library_of(target)
    if lib is not None:
      epilogue = bt.gemm_epilogue(inst)
      detail = target + (f" epilogue={epilogue}" if epilogue else "")
      return KernelKind.LIBRARY_CALL, detail, {}
    return KernelKind.CUSTOM_CALL, target, {}
  if op == "async-start":
    wrapped = inst.async_wrapped_opcode
    callee = inst.called_computation_names()
    if callee and callee[0] in module:
      root = module.computation(callee[0]).root
      kind, detail, fused = _classify(module, root)
      return kind, f"async {detail}", fused
    return KernelKind.CUSTOM_CALL, f"async {wrapped}", {}
  if op in opcodes.COLLECTIVES:
    return KernelKind.COLLECTIVE, op, {}
  if op in ("copy", "copy-start"):
    return KernelKind.COPY, op, {}
  return KernelKind.UNFUSED_OP, op, {}


_OPCODE = operator.attrgetter("opcode")
_NAME = operator.attrgetter("name")


def fused_opcodes(module: HloModule, inst: Instruction) -> dict[str, int]:
  """Opcode counts inside a fusion (nested fusions included), without
  parameters, in order of first appearance."""
  counts: collections.Counter | None = None
  stack = list(inst.called_computations.get("calls", ()))
  seen = set()
  while stack:
    name = stack.pop()
    if name in seen or name not in module:
      continue
    seen.add(name)
    comp = module.computation(name)
    # Counted in C (every kernel's fused body is walked); a Counter keeps
    # first appearances in order, and merging appends the new opcodes.
    here = collections.Counter(map(_OPCODE, comp.instructions))
    here.pop("parameter", None)
    if "fusion" in here:
      for i in comp.instructions:
        if i.opcode == "fusion":
          stack.extend(i.called_computations.get("calls", ()))
    if counts is None:  # the fusion's own body (nested bodies are rare)
      counts = here
    else:
      counts.update(here)
  return dict(counts) if counts is not None else {}


def _io_bytes(module: HloModule, comp: Computation, inst: Instruction,
              dataflow: Dataflow, sizes: dict[ValueId, int],
              fused: Mapping[str, int]) -> tuple[int, int]:
  """Bytes a kernel reads and writes: whole operands and results, except
  that a slice reads only the slice, and an in-place update (dynamic-update-
  slice, scatter) writes only the update into a buffer it does not re-read.
  `sizes` memoizes values' byte sizes across kernels (a value is read by
  each of its users); `fused`: the kernel's `fused_opcodes`."""
  charge, out_charge = _sliced_access(module, comp, inst, fused)
  holds, values = dataflow.holds, dataflow.values
  read = 0
  seen = set()
  for k, operand in enumerate(inst.operands):
    for _, vid in holds.get(operand, ()):
      if vid not in seen:
        seen.add(vid)
        size = sizes.get(vid)
        if size is None:
          size = sizes[vid] = values[vid].byte_size
        read += min(size, charge[k]) if k in charge else size
  written = 0
  for index, v in holds.get(inst.name, ()):
    if v[0] == inst.name or index in out_charge:
      size = sizes.get(v)
      if size is None:
        size = sizes[v] = values[v].byte_size
      written += min(size, out_charge[index]) if index in out_charge else size
  return read, written


_PARTIAL_ACCESS = frozenset({"slice", "dynamic-slice", "dynamic-update-slice", "scatter"})


def _sliced_access(module: HloModule, comp: Computation, inst: Instruction,
                   fused_ops: Mapping[str, int]
                   ) -> tuple[dict[int, int], dict[tuple[int, ...], int]]:
  """(operand number -> bytes really read, output index -> bytes really
  written) where a kernel touches only part of a buffer (`fused_ops`: the
  opcodes of a fusion's body, nested fusions included)."""
  op = inst.opcode
  if op in ("slice", "dynamic-slice") and inst.shape is not None:
    return {0: inst.shape.byte_size}, {}
  if op == "async-start":
    # An asynchronous slice (XLA:TPU's slice-start, staging part of an
    # operand on chip) reads the slice, as a slice does.
    calls = inst.called_computations.get("calls", ())
    if calls and calls[0] in module:
      root = module.computation(calls[0]).root
      if root.opcode in ("slice", "dynamic-slice") and root.shape is not None:
        # Its result's first element holds the operand itself: not written.
        return {0: root.shape.byte_size}, {(0, 0): 0}
    return {}, {}
  if op in ("dynamic-update-slice", "scatter") and len(inst.operands) >= 2:
    update = comp.instruction(inst.operands[-1] if op == "scatter" else inst.operands[1])
    size = update.shape.byte_size if update.shape is not None else 0
    # A scatter combiner reads the elements it updates; a DUS reads nothing.
    return {0: size if op == "scatter" else 0}, {(): size}
  # Most fusions: whole operands in, whole results out (known from the
  # opcodes already counted, without walking the body again).
  if op != "fusion" or _PARTIAL_ACCESS.isdisjoint(fused_ops):
    return {}, {}
  calls = inst.called_computations.get("calls", ())
  if not calls or calls[0] not in module:
    return {}, {}
  fused = module.computation(calls[0])
  if _PARTIAL_ACCESS.isdisjoint(map(_OPCODE, fused.instructions)):
    return {}, {}  # only nested fusions slice
  users: dict[str, list[Instruction]] = {}
  for i in fused.instructions:
    for o in dict.fromkeys(i.operands):
      users.setdefault(o, []).append(i)

  root = fused.root
  outputs = ([((k,), fused.instruction(n)) for k, n in enumerate(root.operands)]
             if root.opcode == "tuple" else [((), root)])
  out_charge: dict[tuple[int, ...], int] = {}
  updated: dict[str, int] = {}
  for index, out in outputs:
    while out.opcode == "bitcast" and out.operands:
      out = fused.instruction(out.operands[0])
    if out.opcode in ("dynamic-update-slice", "scatter") and len(out.operands) >= 2:
      upd = fused.instruction(out.operands[-1] if out.opcode == "scatter" else out.operands[1])
      size = upd.shape.byte_size if upd.shape is not None else 0
      out_charge[index] = size
      updated[out.name] = size if out.opcode == "scatter" else 0
  charge: dict[int, int] = {}
  for p in fused.parameters:
    uses = _bitcast_leaves(users, p.name)
    if not uses:
      continue
    total = 0
    for u, name in uses:
      if u.opcode in ("slice", "dynamic-slice") and u.operands[0] == name and \
          u.shape is not None:
        total += u.shape.byte_size
      elif u.name in updated and u.operands[0] == name:
        total += updated[u.name]
      else:
        break
    else:
      charge[p.parameter_number or 0] = total
  return charge, out_charge


def _bitcast_leaves(users: Mapping[str, list[Instruction]],
                    name: str) -> list[tuple[Instruction, str]]:
  """Non-bitcast users of `name`, seen through bitcasts, with the operand
  name they read. (Not a closure: a recursive one is a reference cycle, and
  its tables would wait for the cyclic collector after every audit.)"""
  out = []
  for u in users.get(name, ()):
    if u.opcode == "bitcast":
      out += _bitcast_leaves(users, u.name)
    else:
      out.append((u, name))
  return out


def _multiplicity(module: HloModule, comps: Mapping[str, Computation]) -> dict[str, int | None]:
  """computation -> times it runs per run of the entry (None: unknown).

  A while body runs its trip count times; its condition once more, which is
  counted as the body's multiplicity (conditions launch little)."""
  mult: dict[str, int | None] = {module.entry_name: 1}
  queue = collections.deque([module.entry_name])
  while queue:
    name = queue.popleft()
    base = mult[name]
    for inst in comps[name].instructions:
      if inst.opcode not in ("while", "conditional", "call", "async-start"):
        continue
      factor = bt.trip_count(inst) if inst.opcode == "while" else 1
      for callee in inst.called_computation_names():
        if callee in comps and callee not in mult:
          mult[callee] = None if base is None or factor is None else base * factor
          queue.append(callee)
  return mult


def _pallas_groups(module: HloModule, comps: Mapping[str, Computation],
                   scopes: tuple[str, ...], names_of: Mapping[str, list[str]]
                   ) -> dict[str, list[str]]:
  """Instructions of interpreted Pallas kernels, grouped by launch (the
  kernel libraries' `scopes`, e.g. "pallas_kernels.", mark them).

  In interpret mode a `pallas_call` lowers to a grid loop (a `while`) plus an
  output initialization and reshapes around it, all under the op's
  `pallas_kernels.<op>` scope, and XLA adds copies of the operands into the
  loop state. One group per launch:

  1. every scoped `while`/`call`/`conditional`/`custom-call` is a launch
     (with everything inside its loop);
  2. other instructions of the op's scope belong to the launch they feed
     (e.g. the initialization of its output), else to a neighbour's group
     (its results: get-tuple-element, slices, pads); scoped instructions near
     no launch (a grid XLA unrolled) form groups by dataflow;
  3. glue whose users are all in groups joins the earliest: copies, tuples,
     bitcasts and broadcasts without a traced op in their metadata (XLA
     names those after the parameter they forward, e.g. "w", or leaves them
     blank).

  XLA's scheduler interleaves the instructions of back-to-back kernels, so
  groups follow dataflow, not text order. (`names_of`: the op_names of each
  computation's instructions, in order.)
  """
  inner: set[str] = set()
  for comp_name, comp in comps.items():
    for inst, op_name in zip(comp.instructions, names_of[comp_name]):
      if inst.opcode in _LOOPS and _scope_of(op_name, scopes):
        for callee in inst.called_computation_names():
          inner.update(_reachable(comps, callee))
  groups: dict[str, list[str]] = {}
  for comp_name, comp in comps.items():
    if comp_name in inner:
      continue  # Inside a launch: already its member.
    for key, members in _comp_groups(comp, scopes, names_of[comp_name]).items():
      expanded = []
      for name in members:
        expanded.append(name)
        inst = comp.instruction(name)
        if inst.opcode in _LOOPS:
          for callee in inst.called_computation_names():
            if callee in comps:
              expanded.extend(_all_instructions(comps, callee))
      groups[f"{comp_name}/{key}"] = expanded
  return groups


#: Control flow whose callees belong to the kernel that launches it.
_LOOPS = ("while", "call", "conditional")
#: Opcodes of the loop-state glue XLA adds around an interpreted kernel.
_GLUE = frozenset({"copy", "tuple", "constant", "broadcast", "bitcast",
                   "get-tuple-element", "reshape"})


def _comp_groups(comp: Computation, scopes: tuple[str, ...],
                 names: list[str]) -> dict[str, list[str]]:
  """Groups (launch name -> members, in text order) of one computation
  (`names`: its instructions' op_names)."""
  insts = comp.instructions
  # Most computations name no scope: one substring test of all op_names
  # together says so (a scope in one name is in the joined text).
  joined = "\n".join(names)
  if not any(prefix in joined for prefix in scopes):
    return {}
  order = {i.name: n for n, i in enumerate(insts)}
  scope = {i.name: _scope_of(n, scopes) for i, n in zip(insts, names)}
  scoped = [i for i in insts if scope[i.name]]
  if not scoped:
    return {}
  users: dict[str, list[str]] = collections.defaultdict(list)
  for inst in insts:
    for o in inst.operands:
      users[o].append(inst.name)
  launches = {i.name for i in scoped if i.opcode in _LOOPS + ("custom-call",)}
  group_of: dict[str, str] = {name: name for name in launches}
  # Inputs: the launch of the same op that the instruction feeds.
  for inst in reversed(scoped):
    if inst.name not in group_of:
      owner = _launch_fed(inst.name, scope, users, launches, comp)
      if owner is not None:
        group_of[inst.name] = owner
  # Results and leftovers: the group of a neighbour of the same op.
  changed = True
  while changed:
    changed = False
    for inst in scoped:
      if inst.name in group_of:
        continue
      near = [group_of[n] for n in (*inst.operands, *users.get(inst.name, ()))
              if n in group_of and scope.get(n) == scope[inst.name]]
      if near:
        group_of[inst.name] = min(near, key=order.__getitem__)
        changed = True
  # Scoped instructions near no launch (XLA unrolled a one-step grid): one
  # group per connected component of the op's instructions.
  leftover = [i for i in scoped if i.name not in group_of]
  parent = {i.name: i.name for i in leftover}

  def root(name: str) -> str:
    while parent[name] != name:
      parent[name] = parent[parent[name]]
      name = parent[name]
    return name

  call = {i.name: _call_name(i.op_name, scopes) for i in leftover}
  for inst in leftover:
    for o in inst.operands:
      if o in parent and call[o] == call[inst.name]:
        a, b = sorted((root(o), root(inst.name)), key=order.__getitem__)
        parent[b] = a
  for inst in leftover:
    group_of[inst.name] = root(inst.name)
  # Glue whose every user is in a group joins the earliest of them (reverse
  # order absorbs chains of glue; loop counters feed several launches).
  changed = True
  while changed:
    changed = False
    for inst in reversed(insts):
      if inst.name in group_of or not _is_glue(inst):
        continue
      owners = [group_of.get(u) for u in users.get(inst.name, ())]
      if owners and None not in owners:
        group_of[inst.name] = min(owners, key=order.__getitem__)
        changed = True
  out: dict[str, list[str]] = {}
  for inst in insts:
    if inst.name in group_of:
      out.setdefault(group_of[inst.name], []).append(inst.name)
  return out


def _launch_fed(name: str, scope: Mapping[str, str], users: Mapping[str, list[str]],
                launches: set[str], comp: Computation) -> str | None:
  """The launch of the same op that `name` feeds, searching forward through
  instructions of that op and glue."""
  queue = collections.deque([name])
  seen = {name}
  while queue:
    for u in users.get(queue.popleft(), ()):
      if u in seen:
        continue
      seen.add(u)
      if scope.get(u) == scope[name]:
        if u in launches:
          return u
        queue.append(u)
      elif not scope.get(u) and _is_glue(comp.instruction(u)):
        queue.append(u)
  return None


def _is_glue(inst: Instruction) -> bool:
  """Loop-state glue: no traced op of the user's named in its metadata."""
  op_name = inst.op_name
  if op_name and "/" in op_name:
    return False  # A traced op ("jit(f)/..."); a bare name is a parameter's.
  if inst.opcode in _GLUE:
    return True
  # XLA:CPU wraps the interpreter's output initialization in a fusion.
  return inst.opcode == "fusion" and inst.name.startswith("wrapped_broadcast")


def _reachable(comps: Mapping[str, Computation], comp_name: str,
               through: frozenset[str] | None = None) -> list[str]:
  """`comp_name` and the computations it calls, transitively (only through
  instructions of the `through` opcodes, when given), depth first."""
  out: list[str] = []
  seen: set[str] = set()
  stack = [comp_name]
  while stack:
    name = stack.pop()
    if name in seen or name not in comps:
      continue
    seen.add(name)
    out.append(name)
    for inst in comps[name].instructions:
      if through is None or inst.opcode in through:
        stack.extend(inst.called_computation_names())
  return out


def _find_scope(op_name: str, scopes: tuple[str, ...]) -> int:
  """Where the first kernel library scope starts in `op_name`, or -1."""
  found = -1
  for prefix in scopes:
    i = op_name.find(prefix)
    if i >= 0 and (found < 0 or i < found):
      found = i
  return found


def _call_name(op_name: str, scopes: tuple[str, ...]) -> tuple[str, ...]:
  """The scope and the `pallas_call` name under it, e.g.
  ("pallas_kernels.matmul", "pallas_kernels_matmul_dact_bgrad"); only
  compared: the instructions of one call share it."""
  i = _find_scope(op_name, scopes)
  parts = op_name[i:].split("/")[:2] if i >= 0 else []
  return tuple(p.rstrip(")") for p in parts)


def _scope_of(op_name: str, scopes: tuple[str, ...]) -> str:
  """The `<library>.<op>` scope named in an op_name, e.g.
  "jit(f)/transpose(jvp(pallas_kernels.matmul))/..." -> "pallas_kernels.matmul"."""
  i = _find_scope(op_name, scopes)
  if i < 0:
    return ""
  rest = op_name[i:]
  j = rest.find("/")
  return (rest if j < 0 else rest[:j]).rstrip(")")


#: Control flow whose bodies run as part of the instruction that calls them.
_RUNS_BODIES = frozenset({"while", "call", "conditional", "async-start"})


def _all_instructions(comps: Mapping[str, Computation], comp_name: str) -> list[str]:
  """Instructions of `comp_name` and of the bodies its control flow runs."""
  return [inst.name for name in _reachable(comps, comp_name, _RUNS_BODIES)
          for inst in comps[name].instructions]


def _pallas_kernel(module, schedule, comps, dataflow, key, members, multiplicity,
                   attribute: Callable[[Instruction], tuple[SourceLocation | None,
                                                            tuple[SourceLocation, ...]]],
                   scopes) -> Kernel:
  member_set = set(members)
  counts: collections.Counter = collections.Counter()
  first = None
  read = written = 0
  for comp_name, name in schedule.sequence:
    if name not in member_set:
      continue
    inst = comps[comp_name].instruction(name)
    counts[inst.opcode] += 1
    if first is None:
      first = (comp_name, inst)
    # Bytes cross the group's boundary: operands from outside, results used outside.
    for operand in inst.operands:
      if operand not in member_set:
        read += sum(dataflow.values[v].byte_size for _, v in dataflow.holds.get(operand, ()))
  comp_name, inst = first
  # Name the kernel after its launch: the loop (interpreted) or the custom
  # call (compiled), else its first scoped instruction.
  scoped = [comps[comp_name].instruction(n) for n in members
            if n in comps[comp_name] and _scope_of(comps[comp_name].instruction(n).op_name,
                                                    scopes)]
  launch = next((i for i in scoped if i.opcode in ("while", "custom-call")),
                scoped[0] if scoped else inst)
  inst = launch
  scope = _scope_of(inst.op_name, scopes)
  # The group's result: what the last top-level member hands to the rest.
  comp = comps[comp_name]
  outside_users = set()
  for i in comp.instructions:
    if i.name in member_set:
      continue
    for o in i.operands:
      if o in member_set:
        outside_users.add(o)
  for o in outside_users:
    written += sum(dataflow.values[v].byte_size for _, v in dataflow.holds.get(o, ()))
  src, stack = attribute(inst)
  return Kernel(
      name=inst.name, computation=comp_name, kind=KernelKind.PALLAS,
      opcode=inst.opcode, detail=f"{scope} (interpreted)",
      fused_ops=types.MappingProxyType(dict(counts)), bytes_read=read,
      bytes_written=written, trip_count=multiplicity.get(comp_name, 1),
      time=schedule.time[inst.name], op_name=inst.op_name,
      members=tuple(members), source=src, source_stack=stack)
