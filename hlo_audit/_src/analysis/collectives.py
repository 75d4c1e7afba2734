"""Collectives of SPMD-partitioned programs, and the findings about them.

An SPMD-partitioned module is one device's program: its shapes, buffers and
peak are per device already, so liveness needs nothing more. What this adds:

- one `Collective` row per collective (an async start/done pair counts once):
  its group size, from `replica_groups` in any of XLA's spellings (explicit
  lists, iota `[groups,size]<=[n]`, mesh axes `mesh['x'=2,'y'=4] {'y'}`, or
  empty: every partition), and the bytes one device sends and receives with
  ring algorithms: all-gather and reduce-scatter (n-1)/n of the full buffer,
  all-reduce twice that, all-to-all (n-1)/n of its input, a permute its input.
- findings: an async collective with no kernel scheduled between its start
  and done (exposed communication); a copy or transpose of a collective's
  result or operand (resharding around it); an all-gather read only by dots
  (a collective-matmul candidate: the dot could consume the shards as they
  arrive, never materializing the gathered buffer); and a replicated entry
  parameter that could be split over the partitions.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from hlo_audit._src.analysis.buffers import is_layout_conversion
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)
from hlo_audit._src.analysis.replay import peak_after_fusions
from hlo_audit._src.analysis.source import attribute
from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction
from hlo_audit._src.hlo.parser import parse_hlo

#: Start halves and the collective they begin.
_STARTS = {"all-gather-start": "all-gather", "all-reduce-start": "all-reduce",
           "collective-permute-start": "collective-permute"}
_DONES = frozenset({"all-gather-done", "all-reduce-done", "collective-permute-done",
                    "async-done"})
_SYNC = frozenset({"all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                   "ragged-all-to-all", "collective-permute", "collective-broadcast"})
#: Ops that pass data through to the real reader.
_PASS = frozenset({"bitcast", "get-tuple-element", "reshape", "tuple"})
#: Replicated parameters smaller than this share of the peak are not reported.
REPLICATED_MIN_PEAK_FRACTION = 0.01


@dataclasses.dataclass(frozen=True, slots=True)
class Collective:
  """One collective: what it moves per device, and what overlaps it."""

  #: The instruction that starts it (the op itself when synchronous).
  name: str
  #: The instruction that completes it ("" when synchronous).
  done: str
  #: "all-gather", "all-reduce", "reduce-scatter", "all-to-all", ...
  opcode: str
  computation: str
  #: Devices in each group (None: unknown).
  group_size: int | None
  #: Bytes one device sends and receives per run (ring algorithms).
  bytes_sent: int
  bytes_received: int
  #: Bytes of its operands and of its result, on one device.
  operand_bytes: int
  result_bytes: int
  start_time: int
  done_time: int
  #: Kernels scheduled between start and done (work that can hide it).
  overlapped: tuple[str, ...] = ()
  trip_count: int | None = 1

  @property
  def is_async(self) -> bool:
    return bool(self.done)


def group_size(module: HloModule, inst: Instruction) -> int | None:
  """Devices per replica group of a collective, from `replica_groups`."""
  raw = (inst.replica_groups or "").strip()
  everyone = max(_int_attr(module, "num_partitions"), _int_attr(module, "replica_count"))
  if inst.opcode.startswith("collective-permute"):
    return 2
  if not raw or raw == "{}":
    return everyone or None
  m = re.match(r"\[([\d,\s]+)\]\s*<=", raw)
  if m:  # iota list: [groups, size]<=[...]
    dims = [int(d) for d in m.group(1).split(",") if d.strip()]
    return dims[-1] if dims else None
  m = re.match(r"mesh\[(.*?)\]\s*\{(.*)\}", raw)
  if m:  # named mesh axes: mesh['x'=2,'y'=4] {'y'}
    sizes = dict(re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1)))
    named = re.findall(r"'([^']+)'", m.group(2))
    size = 1
    for axis in named:
      size *= int(sizes.get(axis, 1))
    return size
  m = re.match(r"\{\s*\{([^}]*)\}", raw)
  if m:
    return len([d for d in m.group(1).split(",") if d.strip()])
  return None


def _int_attr(module: HloModule, key: str) -> int:
  try:
    return int(module.attributes.get(key, "0"))
  except ValueError:
    return 0


def _traffic(opcode: str, n: int | None, operand_bytes: int, result_bytes: int
             ) -> tuple[int, int]:
  if not n or n <= 1:
    return 0, 0
  if opcode == "all-gather":
    moved = result_bytes * (n - 1) // n
  elif opcode == "reduce-scatter":
    moved = operand_bytes * (n - 1) // n
  elif opcode == "all-reduce":
    moved = 2 * operand_bytes * (n - 1) // n
  elif opcode in ("all-to-all", "ragged-all-to-all"):
    moved = operand_bytes * (n - 1) // n
  else:  # collective-permute, collective-broadcast
    moved = operand_bytes
  return moved, moved


def _bytes(shape) -> int:
  if shape is None:
    return 0
  if shape.is_tuple:
    return sum(_bytes(s) for s in shape.tuple_shapes)
  return shape.byte_size


def find_collectives(program: Program) -> tuple[Collective, ...]:
  """Every collective in schedule order, async halves paired (found once
  per audit: the report lists them, the findings read them)."""
  if program.tables.collectives is None:
    program.tables.collectives = _collectives(program)
  return program.tables.collectives


def _collectives(program: Program) -> tuple[Collective, ...]:
  module, schedule = program.module, program.schedule
  kernels = program.kernels.values()
  time = schedule.time
  trip = {k.name: k.trip_count for k in kernels}
  by_comp: dict[str, list[Kernel]] = {}
  for k in kernels:
    by_comp.setdefault(k.computation, []).append(k)
  out = []
  for comp_name in schedule.span:
    comp = module.computation(comp_name)
    done_of: dict[str, str] = {}
    for inst in comp.instructions:
      if inst.opcode in _DONES and inst.operands:
        start = inst.operands[0]
        while start in comp and comp.instruction(start).opcode == "async-update":
          start = comp.instruction(start).operands[0]
        done_of[start] = inst.name
    for inst in comp.instructions:
      opcode = _collective_opcode(module, inst)
      if opcode is None or inst.name not in time:
        continue
      operands = [comp.instruction(o) for o in inst.operands if o in comp]
      operand_bytes = sum(_bytes(o.shape) for o in operands)
      done = done_of.get(inst.name, "") if inst.opcode not in _SYNC else ""
      result = comp.instruction(done).shape if done else inst.shape
      n = group_size(module, _wrapped(module, inst))
      sent, received = _traffic(opcode, n, operand_bytes, _bytes(result))
      start_t = time[inst.name]
      done_t = time.get(done, start_t) if done else start_t
      overlapped = tuple(k.name for k in by_comp.get(comp_name, ())
                         if start_t < k.time < done_t) if done_t > start_t + 1 else ()
      out.append(Collective(
          name=inst.name, done=done, opcode=opcode, computation=comp_name,
          group_size=n, bytes_sent=sent, bytes_received=received,
          operand_bytes=operand_bytes, result_bytes=_bytes(result),
          start_time=start_t, done_time=done_t, overlapped=overlapped,
          trip_count=trip.get(inst.name, 1)))
  out.sort(key=lambda c: c.start_time)
  return tuple(out)


def _wrapped(module: HloModule, inst: Instruction) -> Instruction:
  """The collective an async-start wraps (the instruction itself otherwise),
  through the fusion XLA:GPU puts around a collective it runs as a kernel of
  its own (`fusion-start`, kind `__triton_collective`: small all-reduces)."""
  if inst.opcode != "async-start":
    return inst
  root = inst
  for _ in range(3):  # async wrapper -> fusion -> the collective
    callee = root.called_computation_names()
    if not callee or callee[0] not in module:
      break
    root = module.computation(callee[0]).root
    if root.opcode != "fusion":
      break
  return root


def _collective_opcode(module: HloModule, inst: Instruction) -> str | None:
  if inst.opcode in _SYNC:
    return inst.opcode
  if inst.opcode in _STARTS:
    return _STARTS[inst.opcode]
  if inst.opcode == "async-start":
    root = _wrapped(module, inst)
    if root.opcode in _SYNC:
      return root.opcode
  return None


# ------------------------------------------------------------- findings ----


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Exposed communication, resharding copies, collective-matmul candidates
  and replicated parameters of a partitioned program."""
  module = program.module
  found: list[FusionDecisionRecord] = []
  collectives = find_collectives(program)
  for c in collectives:
    comp = module.computation(c.computation)
    inst = comp.instruction(c.name)
    loc = attribute(module, inst)[0]
    moved = c.bytes_sent + c.bytes_received
    if c.is_async and not c.overlapped:
      found.append(_record(
          FindingKind.EXPOSED_COLLECTIVE, c, boundary=c.name, shape=_shape(comp, c),
          bytes_saved=0, evidence=(f"{c.name} at step {c.start_time} and {c.done} at "
                                   f"step {c.done_time}: no kernel between them"),
          reasons=(f"{moved} B sent and received per device with nothing to hide it",),
          risks=("moving work between start and done may raise the peak",),
          suggestion=("let XLA's latency-hiding scheduler overlap it "
                      "(--xla_gpu_enable_latency_hiding_scheduler=true) or give it "
                      "independent work: split the layer (collective matmul) or "
                      "pipeline microbatches"), loc=loc, program=program))
    # Resharding copies: a layout conversion of the collective's result, or
    # one whose only reader is the collective.
    result = c.done or c.name

    def reshard(copy: Instruction, what: str, reason: str, suggestion: str):
      k = program.kernels.get(copy.name)
      found.append(_record(
          FindingKind.RESHARD_AROUND_COLLECTIVE, c, boundary=copy.name,
          shape=copy.shape.dtype_str if copy.shape is not None else "",
          bytes_saved=k.bytes_moved if k else 0,
          evidence=f"{copy.name} copies or transposes the {what} of {c.name}",
          reasons=(reason,),
          risks=("the layout may be forced by a custom call or an output",),
          suggestion=suggestion, loc=loc, program=program))

    for reader in _readers(program, comp, result):
      if is_layout_conversion(module, reader):
        reshard(reader, "result",
                "the layout after the collective differs from what its reader wants",
                "shard the operand along the dimension its consumer reads "
                "(PartitionSpec), so the gathered layout is the one used")
    for operand in inst.operands:
      if operand in comp:
        src = comp.instruction(operand)
        if is_layout_conversion(module, src) and [
            r.name for r in _readers(program, comp, src.name)] == [c.name]:
          reshard(src, "operand", "a layout change made only to feed the collective",
                  "shard along the dimension the producer writes, or let "
                  "the collective take the producer's layout")
    if c.opcode == "all-gather":
      readers = _readers(program, comp, result, through_layout=True)
      if readers and all(_is_dot(module, r) for r in readers):
        found.append(_record(
            FindingKind.COLLECTIVE_MATMUL, c, boundary=result,
            shape=_shape(comp, c), bytes_saved=0,
            evidence=(f"{result} ({c.result_bytes} B gathered) is read only by "
                      + ", ".join(r.name for r in readers)),
            reasons=("a collective matmul overlaps the gather with the dot and "
                     "never holds the whole gathered operand",),
            risks=("needs a large enough dot to hide the per-shard transfers",),
            suggestion=("XLA_FLAGS=--xla_gpu_threshold_for_windowed_einsum_mib=0 "
                        "(windowed einsum), or a shard_map ring of ppermute + dot"),
            loc=loc, program=program, drop=(result,)))
  # Headers without num_partitions: the widest collective group tells.
  widest = max((c.group_size or 0 for c in collectives), default=0)
  found += _replicated(program, _parameter_shardings(program), widest)
  return tuple(found)


def _record(kind, c: Collective, *, boundary, shape, bytes_saved, evidence, reasons,
            risks, suggestion, loc, program, drop=()) -> FusionDecisionRecord:
  peak_after = peak_saved = None
  exact = True
  if drop:
    # Dropping the gathered buffer is fusing it away with no inputs kept (the
    # quick estimate where it can move the peak: replay.exact_peaks).
    (peak,) = peak_after_fusions(program, [(drop[0], "", ())])
    if peak is not None:
      peak_after, exact = peak
      peak_saved = program.liveness.peak_bytes - peak_after
  return FusionDecisionRecord(
      kind=kind, producer=c.name, consumers=(c.done,) if c.done else (),
      boundary=boundary, boundary_shape=shape, bytes_saved=bytes_saved,
      launches_removed=0,
      extra_arithmetic="none",
      extra_resources=f"{c.bytes_sent} B sent, {c.bytes_received} B received per device",
      numerical_class=NumericalClass.EXACT, guard="none", layout_effect="none",
      evidence=evidence,
      verdict=Verdict.RISKY if kind is FindingKind.COLLECTIVE_MATMUL else Verdict.SAFE,
      reasons=tuple(reasons), risks=tuple(risks), ops=(c.opcode,),
      trip_count=c.trip_count, source=loc, computation=c.computation,
      suggestion=suggestion, peak_after=peak_after, peak_saved=peak_saved,
      peak_exact=exact)


def _shape(comp: Computation, c: Collective) -> str:
  inst = comp.instruction(c.done or c.name)
  shape = inst.shape
  if shape is not None and shape.is_tuple and shape.tuple_shapes:
    shape = shape.tuple_shapes[-1]
  return shape.dtype_str if shape is not None and not shape.is_tuple else ""


def _readers(program: Program, comp: Computation, name: str,
             through_layout: bool = False) -> list[Instruction]:
  """Instructions of `comp` reading `name`, seen through bitcasts, tuples and
  get-tuple-element (and layout conversions when `through_layout`)."""
  out: list[Instruction] = []
  stack = [name]
  seen = set()
  while stack:
    cur = stack.pop()
    for u in program.users(comp, cur):
      if u.name in seen:
        continue
      seen.add(u.name)
      if u.opcode in _PASS or (through_layout and is_layout_conversion(program.module, u)):
        stack.append(u.name)
      else:
        out.append(u)
  return out


def _is_dot(module: HloModule, inst: Instruction) -> bool:
  if inst.opcode in opcodes.MATMUL_LIKE:
    return True
  if inst.opcode == "custom-call":
    return "gemm" in (inst.custom_call_target or "") or "matmul" in (
        inst.custom_call_target or "")
  calls = inst.called_computations.get("calls", ())
  if inst.opcode == "fusion" and calls and calls[0] in module:
    return any(i.opcode in opcodes.MATMUL_LIKE for i in module.computation(calls[0]).instructions)
  return False


def _replicated(program: Program, shardings: Mapping[int, str],
                widest_group: int = 0) -> list[FusionDecisionRecord]:
  module = program.module
  n = _int_attr(module, "num_partitions") or widest_group
  if n <= 1:
    return []
  peak = program.liveness.peak_bytes
  found = []
  axes = None  # read from the HLO before optimization only for a finding
  for p in module.entry.parameters:
    sharding = p.sharding or shardings.get(p.parameter_number) or ""
    if p.shape is None or p.shape.is_tuple or sharding.replace(" ", "") != "{replicated}":
      continue
    size = p.shape.byte_size
    if size < REPLICATED_MIN_PEAK_FRACTION * peak:
      continue
    wasted = size * (n - 1) // n
    dims = list(p.shape.dims)
    split = next((i for i, d in enumerate(dims) if d % n == 0), None)
    if split is None:
      continue
    if axes is None:
      axes = _mesh_axes(program, n)
    spec = ", ".join(axes if i == split else "None" for i in range(len(dims)))
    path = p.op_name or p.name
    # A parameter is a read-only allocation held for the whole run: splitting
    # it takes its replicated share off every step, the peak included.
    found.append(FusionDecisionRecord(
        kind=FindingKind.REPLICATED_BUFFER, producer="", consumers=(),
        boundary=p.name, boundary_shape=p.shape.dtype_str, bytes_saved=0,
        launches_removed=0, extra_arithmetic="none",
        extra_resources=f"{wasted} B per device held {n} times over",
        numerical_class=NumericalClass.EXACT,
        guard="its readers then need an all-gather (FSDP) or a sharded dot",
        layout_effect="the readers see a shard", evidence=(
            f"entry parameter {p.name} is sharding={{replicated}} on {n} partitions"),
        verdict=Verdict.RISKY,
        reasons=(f"dimension {split} ({dims[split]}) divides by {n}",),
        risks=("gathering it for each use adds communication",),
        ops=(path,), computation=module.entry.name,
        suggestion=f"NamedSharding(mesh, P({spec})) for {path}",
        peak_after=peak - wasted, peak_saved=wasted))
  return found


#: A Shardy mesh as JAX lowers it (`xla.sdy.meshes` of the HLO before
#: optimization): `#sdy.mesh<["data"=4, "model"=2]>`, its quotes escaped
#: where the mesh sits inside a string.
_SDY_MESH = re.compile(r'#sdy\.mesh<\[([^\]]*)\]')
_SDY_AXIS = re.compile(r'\\?"([^"\\]+)\\?"\s*=\s*(\d+)')
#: The axis name a suggestion uses when the mesh's names are unknown.
PLACEHOLDER_AXIS = "'data'"


def _mesh_axes(program: Program, n: int) -> str:
  """The PartitionSpec entry that splits a dimension over all `n`
  partitions: the mesh axis of that size (`'d'`), or the axes whose sizes
  multiply to it (`('data', 'model')`), named as the user named them; the
  optimized HLO keeps no names (`mesh['axis_0'=8]`), the HLO before
  optimization does. PLACEHOLDER_AXIS where that says nothing or more than
  one mesh."""
  meshes = {m.group(1) for m in _SDY_MESH.finditer(program.pre_optimization_text)}
  if len(meshes) != 1:
    return PLACEHOLDER_AXIS
  axes = [(name, int(size)) for name, size in _SDY_AXIS.findall(meshes.pop())]
  whole = next((name for name, size in axes if size == n), None)
  if whole is not None:
    return repr(whole)
  split = [name for name, size in axes if size > 1]
  product = 1
  for _, size in axes:
    product *= size
  if product != n or not split:
    return PLACEHOLDER_AXIS
  return "(" + ", ".join(map(repr, split)) + ")"


def _parameter_shardings(program: Program) -> Mapping[int, str]:
  """Entry parameter number -> sharding, for a partitioned module whose
  optimized parameters lost theirs (newer XLA): from the HLO before
  optimization, which keeps them."""
  module = program.module
  if module.attributes.get("num_partitions", "1") in ("0", "1") or not \
      program.pre_optimization_text or all(p.sharding for p in module.entry.parameters):
    return {}
  try:
    pre = parse_hlo(program.pre_optimization_text)
  except HloAuditError:
    return {}
  return {p.parameter_number: p.sharding for p in pre.entry.parameters if p.sharding}
