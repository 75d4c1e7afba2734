"""Kernels: every top-level operation that launches work.

Walks the flattened schedule (the entry computation and, through while,
conditional, call and async bodies, everything they run), skipping what
launches nothing (parameters, constants, tuples, get-tuple-element, bitcasts,
control flow itself), and classifies each kernel by what launches it. A
kernel inside a loop body carries the loop's trip count when XLA states it.

Pallas kernels run in interpret mode (CPU) lower to a while loop and copies
of their own; the ops `pallas_kernels` launch sit under a named scope
`pallas_kernels.<op>`, so those instructions, and the metadata-less copies
feeding only them, are reported as one kernel of kind PALLAS.
"""

from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Mapping

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.dataflow import Dataflow
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, SourceLocation

#: The named scope `pallas_kernels` puts around each kernel launch.
PALLAS_SCOPE = "pallas_kernels."

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

  @property
  def bytes_moved(self) -> int:
    return self.bytes_read + self.bytes_written


def find_kernels(module: HloModule, schedule: Schedule,
                 dataflow: Dataflow) -> tuple[Kernel, ...]:
  """Every kernel of `module`, in schedule order."""
  comps = {name: module.computation(name) for name in schedule.span}
  multiplicity = _multiplicity(module, comps)
  groups = _pallas_groups(module, comps)
  grouped = {m: key for key, members in groups.items() for m in members}
  out: list[Kernel] = []
  emitted_groups: set[str] = set()
  for comp_name, name in schedule.sequence:
    comp = comps[comp_name]
    inst = comp.instruction(name)
    if name in grouped:
      key = grouped[name]
      if key not in emitted_groups:
        emitted_groups.add(key)
        out.append(_pallas_kernel(module, schedule, comps, dataflow, key,
                                  groups[key], multiplicity))
      continue
    if inst.opcode in _NO_LAUNCH:
      continue
    if inst.opcode == "custom-call" and inst.custom_call_target in bt.NO_OP_TARGETS:
      continue
    kind, detail, fused = _classify(module, inst)
    read, written = _io_bytes(comp, inst, dataflow)
    out.append(Kernel(
        name=name, computation=comp_name, kind=kind, opcode=inst.opcode,
        detail=detail, fused_ops=types.MappingProxyType(fused),
        bytes_read=read, bytes_written=written,
        trip_count=multiplicity.get(comp_name, 1), time=schedule.time[name],
        op_name=inst.op_name, source=source_of(module, inst)))
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


def fused_opcodes(module: HloModule, inst: Instruction) -> dict[str, int]:
  """Opcode counts inside a fusion (nested fusions included), without
  parameters."""
  counts: collections.Counter = collections.Counter()
  stack = list(inst.called_computations.get("calls", ()))
  seen = set()
  while stack:
    name = stack.pop()
    if name in seen or name not in module:
      continue
    seen.add(name)
    for i in module.computation(name).instructions:
      if i.opcode == "parameter":
        continue
      if i.opcode == "fusion":
        stack.extend(i.called_computations.get("calls", ()))
      counts[i.opcode] += 1
  return dict(counts)


def _io_bytes(comp: Computation, inst: Instruction, dataflow: Dataflow) -> tuple[int, int]:
  read = 0
  seen = set()
  for operand in inst.operands:
    for _, vid in dataflow.holds.get(operand, ()):
      if vid not in seen:
        seen.add(vid)
        read += dataflow.values[vid].byte_size
  written = sum(dataflow.values[v].byte_size for _, v in dataflow.holds.get(inst.name, ())
                if v[0] == inst.name)
  return read, written


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


def source_of(module: HloModule, inst: Instruction) -> SourceLocation | None:
  """The user's source line of `inst`, looking inside fusions when the
  fusion itself carries none (root first, then any fused op)."""
  loc = module.source_location(inst)
  if loc is not None:
    return loc
  for callee in inst.called_computations.get("calls", ()):
    if callee not in module:
      continue
    comp = module.computation(callee)
    for i in (comp.root,) + comp.instructions:
      loc = module.source_location(i)
      if loc is not None:
        return loc
  return None


def _pallas_groups(module: HloModule,
                   comps: Mapping[str, Computation]) -> dict[str, list[str]]:
  """Instructions of interpreted Pallas kernels, grouped by launch.

  A group starts at the first instruction whose op_name carries the
  `pallas_kernels.<op>` scope and takes the scoped instructions that follow
  in the same computation (and everything inside the loops they run), plus
  metadata-less copies and tuples that only feed the group.
  """
  groups: dict[str, list[str]] = {}
  for comp_name, comp in comps.items():
    users: dict[str, list[str]] = collections.defaultdict(list)
    for inst in comp.instructions:
      for o in inst.operands:
        users[o].append(inst.name)
    current: str | None = None
    current_scope = ""
    for inst in comp.instructions:
      op_name = inst.op_name
      scope = _scope_of(op_name)
      if scope:
        if current is None or scope != current_scope:
          current, current_scope = f"{comp_name}/{inst.name}", scope
          groups[current] = []
        groups[current].append(inst.name)
        for callee in inst.called_computation_names():
          if callee in comps and inst.opcode in ("while", "call", "conditional"):
            groups[current].extend(_all_instructions(module, comps, callee))
      elif current is not None and op_name:
        # Another op of the user's: the kernel's instructions are over.
        # (Metadata-less copies and tuples in between belong to it.)
        current = None
    # Loop-state copies and tuples without metadata that only feed a group.
    member_of = {m: k for k, ms in groups.items() for m in ms}
    for inst in reversed(comp.instructions):
      if inst.name in member_of or inst.op_name:
        continue
      if inst.opcode not in ("copy", "tuple", "constant", "broadcast"):
        continue
      targets = {member_of.get(u) for u in users.get(inst.name, ())}
      if len(targets) == 1 and None not in targets:
        key = targets.pop()
        groups[key].append(inst.name)
        member_of[inst.name] = key
  return groups


def _scope_of(op_name: str) -> str:
  i = op_name.find(PALLAS_SCOPE)
  if i < 0:
    return ""
  rest = op_name[i:]
  j = rest.find("/")
  return rest if j < 0 else rest[:j]


def _all_instructions(module, comps, comp_name: str) -> list[str]:
  out = []
  stack = [comp_name]
  seen = set()
  while stack:
    name = stack.pop()
    if name in seen or name not in comps:
      continue
    seen.add(name)
    for inst in comps[name].instructions:
      out.append(inst.name)
      if inst.opcode in ("while", "call", "conditional", "async-start"):
        stack.extend(inst.called_computation_names())
  return out


def _pallas_kernel(module, schedule, comps, dataflow, key, members, multiplicity) -> Kernel:
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
            if n in comps[comp_name] and _scope_of(comps[comp_name].instruction(n).op_name)]
  launch = next((i for i in scoped if i.opcode in ("while", "custom-call")),
                scoped[0] if scoped else inst)
  inst = launch
  scope = _scope_of(inst.op_name)
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
  return Kernel(
      name=inst.name, computation=comp_name, kind=KernelKind.PALLAS,
      opcode=inst.opcode, detail=f"{scope} (interpreted)",
      fused_ops=types.MappingProxyType(dict(counts)), bytes_read=read,
      bytes_written=written, trip_count=multiplicity.get(comp_name, 1),
      time=schedule.time[inst.name], op_name=inst.op_name,
      source=source_of(module, inst), members=tuple(members))
