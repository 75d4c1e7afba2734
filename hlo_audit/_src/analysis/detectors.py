"""Detectors: find the boundaries XLA left, as fusion decision records.

One detector per finding class; each reads the IR and earlier analyses and
returns records (no printing, no state). `find_findings` runs them all.

What the epilogue and prologue detectors recognise is read from the fused
computations: the JAX primitive names XLA keeps in `op_name` metadata (add,
mul, erf, tanh, logistic, convert_element_type, ...) where present, the
opcodes otherwise.
"""

from __future__ import annotations

import collections

import dataclasses
from collections.abc import Mapping, Sequence

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis import source as source_mod
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import (Buffer, Lifetime,
                                             expanded_broadcast_ratio,
                                             fused_root, is_layout_conversion)
from hlo_audit._src.analysis.dataflow import Dataflow, ValueId
from hlo_audit._src.analysis.kernel_library import Libraries, with_kernels
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.layouts import kernel_permutes, permutes
from hlo_audit._src.analysis.options import AuditOptions
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             KernelNeed, NumericalClass, Statistics,
                                             Verdict)
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo import dtypes, opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, op_names


@dataclasses.dataclass(frozen=True, slots=True)
class _Context:
  module: HloModule
  schedule: Schedule
  dataflow: Dataflow
  kernels: Mapping[str, Kernel]
  buffers: Mapping[str, Buffer]
  #: kernel name -> buffers it writes.
  writes: Mapping[str, tuple[Buffer, ...]]
  comps: Mapping[str, Computation]
  options: AuditOptions
  peak_bytes: int
  has_backward: bool
  #: while body computation -> name of the while instruction running it.
  loop_of: Mapping[str, str] = dataclasses.field(default_factory=dict)
  #: kernel name -> primitives it runs (filled on first use).
  _primitives: dict = dataclasses.field(default_factory=dict)
  #: computation -> instruction name -> its users (filled on first use).
  _users: dict = dataclasses.field(default_factory=dict)
  #: kernel name -> `_anchor` (filled on first use: asked of every reader).
  _anchors: dict = dataclasses.field(default_factory=dict)
  #: kernel name -> `_operand_producers`, `_same_index` (filled on first
  #: use: `_depends_on` walks the same kernels from every epilogue).
  _inputs: dict = dataclasses.field(default_factory=dict)
  _same: dict = dataclasses.field(default_factory=dict)
  #: "table": `_broadcast_scales` (filled on first use: `_affine` asks of
  #: the same kernels around every reduction).
  _scales: dict = dataclasses.field(default_factory=dict)

  def users(self, comp: Computation, name: str) -> list[Instruction]:
    """Instructions of `comp` that read `name`, in text order."""
    table = self._users.get(comp.name)
    if table is None:
      table = self._users[comp.name] = {}
      for i in comp.instructions:
        for o in dict.fromkeys(i.operands):
          table.setdefault(o, []).append(i)
    return table.get(name, [])

  def inst(self, kernel: Kernel) -> Instruction:
    return self.comps[kernel.computation].instruction(kernel.name)

  def primitives(self, kernel: Kernel) -> frozenset[str]:
    """JAX primitives (or opcodes) a kernel runs, fused ones included."""
    found = self._primitives.get(kernel.name)
    if found is None:
      fused = _fused(self, kernel)
      insts = fused.instructions if fused is not None else (self.inst(kernel),)
      found = self._primitives[kernel.name] = _primitives(insts)
    return found


def find_findings(module: HloModule, schedule: Schedule, dataflow: Dataflow,
                  kernels: tuple[Kernel, ...], buffers: tuple[Buffer, ...],
                  peak_bytes: int, options: AuditOptions = AuditOptions(),
                  libraries: Libraries = Libraries()) -> tuple[FusionDecisionRecord, ...]:
  """All findings, largest saving first within each class; each finding a
  kernel could close names the libraries' op for its `need`."""
  by_kernel: dict[str, list[Buffer]] = {}
  for b in buffers:
    if b.producer:
      by_kernel.setdefault(b.producer, []).append(b)
  ctx = _Context(
      module=module, schedule=schedule, dataflow=dataflow,
      kernels={k.name: k for k in kernels},
      buffers={b.name: b for b in buffers},
      writes={k: tuple(v) for k, v in by_kernel.items()},
      comps={n: module.computation(n) for n in schedule.span},
      options=options, peak_bytes=peak_bytes,
      has_backward=any("transpose(" in k.op_name for k in kernels),
      loop_of={body: i.name for comp in module.computations
               for i in comp.instructions if i.opcode == "while"
               for body in i.called_computations.get("body", ())})
  found: list[FusionDecisionRecord] = []
  found += _copies(ctx)
  found += _expanded_broadcasts(ctx)
  epilogues, fused = _epilogues(ctx)
  found += epilogues
  # dot -> elementwise -> dot: the elementwise kernel is the first dot's
  # epilogue or the second's prologue, not both (only one boundary can go).
  by_consumer = {c: i for i, r in enumerate(found) if r.kind is FindingKind.UNFUSED_EPILOGUE
                 for c in r.consumers}
  for r in _prologues(ctx):
    i = by_consumer.get(r.producer)
    if i is None:
      found.append(r)
    else:
      found[i] = dataclasses.replace(found[i], notes=found[i].notes + (
          f"alternatively a prologue of {', '.join(r.consumers)}: {r.producer} "
          f"writes {r.boundary_shape} ({', '.join(r.ops)}) only for matmuls",))
  found += _separate_reductions(ctx)
  found += _materialized_slices(ctx)
  found += _loop_invariant(ctx)
  found += _keep_reuse(ctx)
  found = _merge(with_kernels(found, libraries))
  found += fused
  order = list(FindingKind)
  found = [r for r in found if r.bytes_saved >= options.min_bytes_saved or
           r.kind in (FindingKind.KEEP_REUSE, FindingKind.ALREADY_FUSED)]
  found.sort(key=lambda r: (order.index(r.kind), -r.bytes_saved, r.boundary))
  return tuple(found)


# ------------------------------------------------------------- helpers ----


def _trip(k: Kernel) -> int | None:
  return k.trip_count


def _times(n: int, trip: int | None) -> int:
  return n * (trip if trip is not None else 1)


def _consumer_kernels(ctx: _Context, buf: Buffer) -> list[Kernel]:
  return [ctx.kernels[c] for c in buf.consumers if c in ctx.kernels]


def _anchor(ctx: _Context, k: Kernel) -> str | None:
  """"dot" or "convolution" when the kernel is a matrix-multiply anchor."""
  try:
    return ctx._anchors[k.name]
  except KeyError:
    found = ctx._anchors[k.name] = _find_anchor(ctx, k)
    return found


def _find_anchor(ctx: _Context, k: Kernel) -> str | None:
  inst = ctx.inst(k)
  if k.kind is KernelKind.PALLAS:
    return None
  if inst.opcode in ("dot", "ragged-dot", "scaled-dot") or bt.is_gemm_call(inst):
    return "dot"
  if inst.opcode == "convolution" or bt.is_conv_call(inst):
    return "convolution"
  if inst.opcode == "fusion":
    ops = k.fused_ops
    if "dot" in ops or "scaled-dot" in ops:
      return "dot"
    if "convolution" in ops:
      return "convolution"
    if _split_k_site(ctx, k) is not None:
      return "dot"  # it sums a gemm's split-K partial sums: it finishes the dot
  return None


def _split_k_site(ctx: _Context, k: Kernel) -> Instruction | None:
  """The reduce summing a Triton gemm's split-K partial sums (f32[k,M,N]
  over dimension 0), when kernel `k` runs one."""
  if "reduce" not in k.fused_ops:
    return None
  fused = _fused(ctx, k)
  if fused is None:
    return None
  return next((i for i in fused.instructions if bt.is_split_k_reduce(i)), None)


def _anchor_fused_epilogue(ctx: _Context, k: Kernel) -> tuple[str, ...]:
  """Elementwise work XLA already fused after the anchor inside the kernel."""
  inst = ctx.inst(k)
  epilogue = bt.gemm_epilogue(inst) if inst.opcode == "custom-call" else None
  if epilogue:
    return bt.GEMM_EPILOGUES.get(epilogue, (epilogue.lower(),))
  conv = bt.conv_epilogue(inst)
  if conv:
    return conv
  if inst.opcode != "fusion":
    return ()
  found = fused_root(ctx.module, inst)
  if found is None:
    return ()
  comp, root = found
  if root.opcode in ("dot", "convolution", "bitcast", "copy", "tuple"):
    return ()
  # Every split-K sum is the gemm's (a kernel may sum several gemms' partials).
  stop = {i.name for i in comp.instructions if bt.is_split_k_reduce(i)}
  if root.name in stop:
    return ()
  # The work, not the data movement around it (broadcast constants, bitcasts).
  return tuple(sorted({_primitive(i) for i in _path_to_anchor(comp, root, stop)
                       if i.opcode not in opcodes.DATA_MOVEMENT} - {""}))


def _path_to_anchor(comp: Computation, root: Instruction,
                    stop: set[str] | frozenset[str] = frozenset()) -> list[Instruction]:
  """The instructions from `root` back to the anchor (a dot, a convolution,
  or the reduces in `stop`: a split-K sum)."""
  out = []
  stack = [root]
  seen = set()
  while stack:
    i = stack.pop()
    if i.name in seen or i.name in stop or i.opcode in (
        "dot", "convolution", "parameter", "constant"):
      continue
    seen.add(i.name)
    out.append(i)
    stack.extend(comp.instruction(o) for o in i.operands)
  return out


def _primitive(inst: Instruction) -> str:
  """The JAX primitive behind an instruction (from op_name), else opcode."""
  return inst.op_name.rpartition("/")[2] or inst.opcode


def _primitives(insts: Sequence[Instruction]) -> frozenset[str]:
  """`_primitive` of each of `insts` (op names read in one pass)."""
  return frozenset(name.rpartition("/")[2] or inst.opcode
                   for name, inst in zip(op_names(insts), insts))


def _fused(ctx: _Context, k: Kernel) -> Computation | None:
  inst = ctx.inst(k)
  calls = inst.called_computations.get("calls", ())
  if inst.opcode != "fusion" or not calls or calls[0] not in ctx.module:
    return None
  return ctx.module.computation(calls[0])


def _operand_number(ctx: _Context, consumer: Kernel, buf: Buffer) -> int | None:
  inst = ctx.inst(consumer)
  for k, operand in enumerate(inst.operands):
    for idx, vid in ctx.dataflow.holds.get(operand, ()):
      if vid == (buf.instruction, buf.index):
        return k
  return None


def _layouts(ctx: _Context, k: Kernel, inst: Instruction) -> tuple[str, str]:
  """(operand layout, result layout) of a copy-like kernel; for a fusion
  whose permutation happens inside (a transpose between bitcasts), the
  permuting instruction's, so the two differ where the data moves."""
  src = _layout_of(ctx, inst.operands[0], k.computation) if inst.operands else "{}"
  dst = str(inst.shape.layout) if inst.shape is not None and inst.shape.layout else "{}"
  fused = _fused(ctx, k)
  if src == dst and fused is not None:
    for i in fused.instructions:
      if i.opcode in ("transpose", "copy") and permutes(fused, i):
        before = _layout_of(ctx, i.operands[0], None) if i.operands[0] not in fused \
            else str(fused.instruction(i.operands[0]).shape.layout or "{}")
        if i.opcode == "transpose":
          return (f"{fused.instruction(i.operands[0]).shape.dtype_str}{before}",
                  f"{i.shape.dtype_str}{i.shape.layout or ''} "
                  f"(dimensions={{{','.join(map(str, i.dimensions or ()))}}})")
        return before, str(i.shape.layout or "{}")
  return src, dst


def _layout_of(ctx: _Context, name: str, computation: str | None = None) -> str:
  if computation is not None and name in ctx.comps[computation]:
    shape = ctx.comps[computation].instruction(name).shape
    return str(shape.layout) if shape is not None and shape.layout is not None else "{}"
  for comp in ctx.comps.values():
    if name in comp:
      shape = comp.instruction(name).shape
      if shape is not None and shape.layout is not None:
        return str(shape.layout)
  return "{}"


def _kernel_desc(k: Kernel) -> str:
  return f"{k.kind.value} {k.name}" + (f" ({k.detail})" if k.detail and k.detail != k.opcode else "")


_COMMON_RISKS = ("compile time: a larger kernel compiles slower",
                 "debuggability: one fused kernel is harder to inspect")


# ------------------------------------------ classes 1-2: copies, layouts ----


def _through_bitcasts(comp: Computation, name: str) -> Instruction | None:
  inst = comp.instruction(name) if name in comp else None
  while inst is not None and inst.opcode in ("bitcast", "reshape") and inst.operands:
    inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  return inst


def _aliasing_copy(ctx: _Context, k: Kernel, inst: Instruction) -> str:
  """For an entry copy of a donated parameter: why XLA copies it, else ""."""
  comp = ctx.comps[k.computation]
  if comp.name != ctx.module.entry.name or inst.opcode != "copy" or not inst.operands:
    return ""
  src = _through_bitcasts(comp, inst.operands[0])
  if src is None or src.opcode != "parameter":
    return ""
  outputs = [a.output_index for a in ctx.module.input_output_alias
             if a.parameter == src.parameter_number]
  if not outputs:
    return ""
  readers = [u.name for u in ctx.users(comp, inst.name)]
  out = ",".join(map(str, outputs[0]))
  return (f"argument {src.parameter_number} ({src.name}) is donated and aliased to "
          f"output {{{out}}}, but its old value is still read after the kernel "
          f"writing that output runs, so XLA copies it first (read by "
          f"{', '.join(readers[:4])}{'...' if len(readers) > 4 else ''})")


def _loop_role(ctx: _Context, k: Kernel, inst: Instruction) -> tuple[str, str]:
  """(role, explanation) of a copy on a while loop's boundary, else ("", "")."""
  comp = ctx.comps[k.computation]
  users = ctx.users(comp, k.name)
  feeds_while = [u for u in users if u.opcode == "while"] + [
      w for u in users if u.opcode == "tuple"
      for w in ctx.users(comp, u.name) if w.opcode == "while"]
  if feeds_while:
    src = _through_bitcasts(comp, inst.operands[0]) if inst.operands else None
    siblings = [u for u in ctx.users(comp, src.name) if u.opcode == "copy"] \
        if src is not None else []
    trip = bt.trip_count(feeds_while[0])
    trips = f" (the loop runs {trip} times)" if trip else ""
    if src is not None and src.opcode == "parameter":
      why = (f"entry argument {src.name} is loop state the body overwrites in "
             "place; an argument that is not donated must not be overwritten, so "
             "XLA copies it into the loop's initial state" + trips +
             ". Donating the argument (donate_argnums) lets the loop own it")
      return "loop-init copy (argument)", why
    if len(siblings) > 1:
      why = (f"one value ({src.name}) initialises {len(siblings)} carry elements; "
             "each element needs a buffer of its own, so XLA copies it into each"
             + trips + ". These are the initial contents of loop state (e.g. a "
             "scan's stacked outputs), not layout changes")
      return "loop-init copy (shared initial value)", why
    why = ("the initial value is still needed after the loop starts (or is a "
           "constant), so XLA copies it into the loop state" + trips)
    return "loop-init copy", why
  if comp.name == ctx.module.entry.name and any(
      u.name == comp.root_name for u in users) or k.name == comp.root_name:
    src = _through_bitcasts(comp, inst.operands[0]) if inst.operands else None
    if src is not None and src.opcode == "parameter":
      return "output copy (argument)", (
          f"the program returns entry argument {src.name} (or a view of it); an "
          "argument that is not donated cannot be the output buffer, so XLA "
          "copies it. Donating it (donate_argnums) or not returning it removes "
          "the copy")
    return "output copy", (
        "each output needs a buffer of its own: a value returned more than once, "
        "or a constant, is copied into each output")
  loop = ctx.loop_of.get(comp.name)
  if loop is None:
    return "", ""
  param = comp.parameters[0].name if comp.parameters else ""
  src = _through_bitcasts(comp, inst.operands[0]) if inst.operands else None
  trip = k.trip_count
  per = f", {trip} times per run" if trip else ""
  if src is not None and src.opcode == "get-tuple-element" and src.operands and \
      src.operands[0] == param:
    why = (f"carry element {src.tuple_index} of while loop {loop} is copied at the "
           "top of the body: its old value is still read after the body writes "
           f"the new one{per}. Computing every use of the old value before "
           "updating it (or carrying both) removes the copy")
    return "loop-carry copy (body entry)", why
  root = comp.root
  if k.name == root.name or (root.opcode == "tuple" and k.name in root.operands):
    why = (f"the new value of a carry element of while loop {loop} is copied into "
           f"the loop state at the end of the body{per}: the value it is computed "
           "from shares the old carry's buffer")
    return "loop-carry copy (body exit)", why
  return "", ""


def _round_trip(ctx: _Context, k: Kernel, consumers: list[Kernel]) -> tuple[list[Kernel], bool]:
  """Consumers converting `k`'s result back to its source dtype, and whether
  the round trip preserves values (widening first, e.g. bf16 -> f32 -> bf16)."""
  back = [c for c in consumers if _converts_back(ctx, k, c)]
  if not back or len(back) != len(consumers):
    # Another reader uses the converted value itself: not a round trip to
    # remove (e.g. x cast to bf16 for a dot, and back to f32 for another).
    return [], False
  a = ctx.inst(k)
  src = ctx.comps[k.computation].instruction(a.operands[0]).shape
  widening = dtypes.is_widening(src.element_type, a.shape.element_type)
  return back, widening


def _narrowing_round_trip(ctx: _Context, k: Kernel, consumers: Sequence[Kernel]) -> str:
  """"f32 -> bf16 -> f32" when removing `k` drops a rounding the program
  asked for: `k` narrows a value and widens it back itself, or narrows it
  and a reader widens it on load; "" otherwise."""
  fused = _fused(ctx, k)
  comp = fused if fused is not None else ctx.comps[k.computation]
  insts = fused.instructions if fused is not None else (ctx.inst(k),)
  narrowed = None
  for i in insts:
    if i.opcode != "convert" or not i.operands or i.shape is None:
      continue
    src = _through_moves(comp, i.operands[0])
    a = src.shape.element_type if src is not None and src.shape is not None else None
    if src is not None and src.opcode == "convert" and src.operands:
      first = _through_moves(comp, src.operands[0])
      if first is not None and first.shape is not None:
        t0, t1, t2 = first.shape.element_type, a, i.shape.element_type
        if t0 == t2 != t1 and not dtypes.is_widening(t0, t1):
          return f"{t0} -> {t1} -> {t2}"
    if a is not None and a != i.shape.element_type and \
        not dtypes.is_widening(a, i.shape.element_type):
      narrowed = (a, i.shape.element_type)
  if narrowed is None:
    return ""
  for c in consumers:
    cf = _fused(ctx, c)
    if cf is not None and any(
        i.opcode == "convert" and i.shape is not None and
        i.shape.element_type == narrowed[0] and i.operands and
        (src := _through_moves(cf, i.operands[0])) is not None and
        src.opcode == "parameter" and src.shape is not None and
        src.shape.element_type == narrowed[1] for i in cf.instructions):
      return f"{narrowed[0]} -> {narrowed[1]} -> {narrowed[0]}"
  return ""


def _through_moves(comp: Computation, name: str) -> Instruction | None:
  """The instruction behind `name`, through reshapes, bitcasts, copies and
  transposes (data movement that keeps values)."""
  inst = comp.instruction(name) if name in comp else None
  while inst is not None and inst.opcode in ("bitcast", "reshape", "copy", "transpose") \
      and inst.operands:
    inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  return inst


def _drops_rounding(r: FusionDecisionRecord, trip: str) -> FusionDecisionRecord:
  """`r` for a fix that removes a narrowing round trip: never bit-exact,
  never safe."""
  return dataclasses.replace(
      r, numerical_class=NumericalClass.PRECISION_CHANGE,
      verdict=Verdict.RISKY if r.verdict is Verdict.SAFE else r.verdict,
      reasons=r.reasons + (f"the kernel rounds {trip}: removing it removes "
                           "the rounding, and the results change",),
      evidence=r.evidence + f"; it holds a narrowing round trip ({trip})")


def _copies(ctx: _Context) -> list[FusionDecisionRecord]:
  """Standalone copies, transposes and conversions, by what they are for:
  aliasing copies of donated arguments, loop-state copies, dtype round
  trips, permutations feeding a matmul (layout conflicts), permutations a
  library requires, and plain copies. Convert-only kernels feeding one
  matmul are left to the prologue detector. A kernel holding a narrowing
  round trip (f32 -> bf16 -> f32) is never removed bit-exactly."""
  out = []
  for k in ctx.kernels.values():
    start = len(out)
    _copies_of(ctx, k, out)
    if len(out) > start:
      consumers = [ctx.kernels[c] for c in {c for r in out[start:] for c in r.consumers}
                   if c in ctx.kernels]
      trip = _narrowing_round_trip(ctx, k, consumers)
      if trip:
        out[start:] = [r if r.numerical_class is NumericalClass.PRECISION_CHANGE
                       else _drops_rounding(r, trip) for r in out[start:]]
  return out


def _copies_of(ctx: _Context, k: Kernel, out: list[FusionDecisionRecord]) -> None:
  """`_copies`'s records for one kernel, appended to `out`."""
  if k.kind is KernelKind.PALLAS:
    return
  inst = ctx.inst(k)
  if not (k.kind is KernelKind.COPY or is_layout_conversion(ctx.module, inst)):
    return
  comp = ctx.comps[k.computation]
  moves = kernel_permutes(ctx.module, comp, inst)
  converts = "convert" in k.fused_ops or inst.opcode == "convert"
  for buf in ctx.writes.get(k.name, ()):
    if buf.internal:
      continue
    consumers = _consumer_kernels(ctx, buf)
    consumer_desc = ", ".join(c.name for c in consumers) or "the program's output"
    src_layout, dst_layout = _layouts(ctx, k, inst)
    rec = dict(
        producer=k.name, consumers=tuple(c.name for c in consumers),
        boundary=buf.name, boundary_shape=buf.shape,
        bytes_saved=_times(2 * buf.bytes, _trip(k)),
        launches_removed=_times(1, _trip(k)), extra_resources="none expected",
        numerical_class=NumericalClass.EXACT, trip_count=_trip(k),
        source=buf.source, computation=k.computation, kernel=None)
    anchors = [c for c in consumers if _anchor(ctx, c)]
    aliasing = _aliasing_copy(ctx, k, inst)
    # A permuting copy into loop state is a layout change first: the
    # producer could write the loop's layout directly.
    role, why = ("", "") if aliasing or moves else _loop_role(ctx, k, inst)
    back, preserving = _round_trip(ctx, k, consumers) if converts else ([], False)
    if aliasing:
      out.append(FusionDecisionRecord(
          kind=FindingKind.STANDALONE_COPY, **rec,
          extra_arithmetic="none", guard="n/a: a change to the program, not a kernel",
          layout_effect="none", evidence=f"aliasing copy: {aliasing}",
          verdict=Verdict.RISKY,
          reasons=("the copy keeps the donated input's old value alive: the "
                   "donation saves no memory for this argument",
                   "fix: let every read of the old value happen before the "
                   "update (e.g. compute the gradient from the same weights the "
                   "update reads), or do not donate this argument"),
          risks=("peak: both the copy and the aliased output are live",),
          ops=("aliasing copy",)))
    elif role:
      keep = ("shared initial value" in role or "initial value is still" in why
              or role == "output copy")
      out.append(FusionDecisionRecord(
          kind=FindingKind.STANDALONE_COPY, **rec,
          extra_arithmetic="none", guard="n/a: loop structure, not a kernel",
          layout_effect="none: same layout", evidence=f"{role}: {why}",
          verdict=Verdict.KEEP if keep else Verdict.RISKY,
          reasons=((f"{role}: required by the loop's buffer discipline",) if keep
                   else (f"{role}: removable only by restructuring the loop",)),
          risks=("loop state: each carry element needs a buffer of its own",),
          ops=(role,)))
    elif back:
      if preserving:
        detail = (f"{buf.shape} is widened by {k.name} and narrowed back by "
                  f"{', '.join(c.name for c in back)}: the values are unchanged")
        verdict, numerical = Verdict.SAFE, NumericalClass.EXACT
        reasons = ("a value-preserving round trip: both conversions can go",)
      else:
        detail = (f"{k.name} rounds to {buf.dtype} and "
                  f"{', '.join(c.name for c in back)} converts back: a rounding "
                  "the program asked for (e.g. a bf16 cast of f32 weights)")
        verdict, numerical = Verdict.RISKY, NumericalClass.PRECISION_CHANGE
        reasons = ("removing the round trip removes the rounding: results change",)
      out.append(FusionDecisionRecord(
          kind=FindingKind.STANDALONE_COPY, **{**rec, "numerical_class": numerical},
          extra_arithmetic="none", guard="none needed",
          layout_effect="none", evidence=f"dtype round trip: {detail}",
          verdict=verdict, reasons=reasons, risks=_COMMON_RISKS,
          ops=("convert round trip",)))
    elif moves and anchors:
      anchor = _anchor(ctx, anchors[0])
      if anchor in bt.LAYOUT_FIXED_ANCHORS:
        out.append(FusionDecisionRecord(
            kind=FindingKind.LAYOUT_CONFLICT, **rec,
            extra_arithmetic="none", guard="n/a",
            layout_effect=f"{src_layout} -> {dst_layout} as the library requires",
            evidence=(f"{k.name} permutes {buf.shape} ({src_layout} -> "
                      f"{dst_layout}) for {anchors[0].name} ({anchor}): the "
                      "backend's convolution library takes canonical layouts "
                      "and XLA's layout assignment inserts this transpose on "
                      "purpose"),
            verdict=Verdict.KEEP,
            reasons=("a data layout the next major operation requires "
                     "(library convolution)",),
            risks=("layout reverse impact: choosing the library's layout "
                   "upstream (e.g. NHWC activations) avoids it",),
            ops=("transpose",)))
      else:
        out.append(FusionDecisionRecord(
            kind=FindingKind.LAYOUT_CONFLICT, **rec,
            need=KernelNeed(FindingKind.LAYOUT_CONFLICT, anchor, ("transpose",)),
            extra_arithmetic="none: the reader indexes the original layout",
            guard="the matmul falls back to XLA's dot outside its guard",
            layout_effect=f"the matmul reads {src_layout} instead of {dst_layout}",
            evidence=(f"XLA materialized a layout conversion: {k.name} permutes "
                      f"{buf.shape} only for {', '.join(a.name for a in anchors)} "
                      f"({anchor}), whose dimension numbers could read the "
                      "original layout"),
            verdict=Verdict.SAFE,
            reasons=("layout interpretation: the matmul reads the operand "
                     "transposed in place",),
            risks=("layout reverse impact: check the backward pass for new "
                   "transposes", "memory coalescing of the transposed read")
            + _COMMON_RISKS, ops=("transpose",)))
    elif not moves and converts and consumers and len(anchors) == len(consumers):
      continue  # a cast read only by matmuls: an unfused prologue
    else:
      what = ("layout change" if moves else
              "dtype conversion" if converts else "same-layout copy")
      elementwise_users = consumers and all(
          c.kind in (KernelKind.LOOP_FUSION, KernelKind.INPUT_FUSION) for c in consumers)
      out.append(FusionDecisionRecord(
          kind=FindingKind.STANDALONE_COPY, **rec,
          extra_arithmetic="index arithmetic in the consumers' loads",
          guard="none needed: consumers keep their XLA fusions",
          layout_effect=(f"consumers read {src_layout} directly instead of the "
                         f"{dst_layout} copy" if moves else
                         "none: consumers read the source"),
          evidence=(f"XLA runs {_kernel_desc(k)} as its own kernel: a {what}"
                    + (f" {src_layout} -> {dst_layout}" if moves else "")
                    + f" of {buf.shape} written to memory and read by {consumer_desc}"),
          verdict=Verdict.SAFE if elementwise_users else Verdict.RISKY,
          reasons=((("layout interpretation in the consumer's loads "
                     "(same-index elements, permuted)",) if moves else
                    ("current element only: the consumer converts on load",))
                   if elementwise_users else
                   ("a data layout the next major operation may not use efficiently",)),
          risks=(("memory coalescing: permuted loads in the consumer may break "
                  "vectorized access",) if moves else ()) +
                ("cache reuse: several consumers would each redo it",) + _COMMON_RISKS,
          ops=(what,)))


def _converts_back(ctx: _Context, first: Kernel, second: Kernel) -> bool:
  """`first` converts dtype a -> b and `second` converts its result back to a."""
  a, b = ctx.inst(first), ctx.inst(second)
  if not (is_layout_conversion(ctx.module, a) and is_layout_conversion(ctx.module, b)):
    return False
  if not a.operands or a.shape is None or b.shape is None or not a.shape.is_array:
    return False
  src = ctx.comps[first.computation].instruction(a.operands[0]).shape
  return (src is not None and src.is_array and
          src.element_type == b.shape.element_type != a.shape.element_type and
          src.dims == b.shape.dims)


# ------------------------------------------- class 3: expanded broadcasts ----


def _expanded_broadcasts(ctx: _Context) -> list[FusionDecisionRecord]:
  out = []
  for buf in ctx.buffers.values():
    if buf.lifetime is not Lifetime.EXPANDED_BROADCAST or buf.internal:
      continue
    k = ctx.kernels.get(buf.producer)
    if k is None:
      continue
    inst = ctx.inst(k)
    ratio = expanded_broadcast_ratio(ctx.module, inst, buf.index,
                                     ctx.comps[k.computation])
    compact = int(buf.bytes / ratio)
    consumers = _consumer_kernels(ctx, buf)
    out.append(FusionDecisionRecord(
        kind=FindingKind.EXPANDED_BROADCAST, producer=k.name,
        consumers=tuple(c.name for c in consumers), boundary=buf.name,
        boundary_shape=buf.shape,
        bytes_saved=_times(2 * (buf.bytes - compact), _trip(k)),
        launches_removed=_times(1, _trip(k)),
        extra_arithmetic="broadcast index math in each consumer's loads",
        extra_resources=f"the compact value ({compact} bytes) per tile",
        numerical_class=NumericalClass.EXACT,
        guard="none needed: consumers broadcast on load",
        layout_effect="none: consumers read the compact value",
        evidence=(f"{_kernel_desc(k)} writes {buf.shape} ({buf.bytes} bytes), an "
                  f"{ratio:.0f}x expansion of a {compact}-byte value, read by "
                  f"{', '.join(c.name for c in consumers) or 'nothing'}"),
        verdict=Verdict.SAFE, reasons=("broadcast scalars or vectors",),
        risks=("cache reuse: each consumer re-broadcasts",) + _COMMON_RISKS,
        ops=("broadcast",), kernel=None, trip_count=_trip(k), source=buf.source,
        computation=k.computation))
  return out


# ------------------------------------------------ class 4: epilogues ----


#: Ops a kernel may run and still be same-index work (an epilogue chain).
_SAME_INDEX_OPS = opcodes.ELEMENTWISE | {"bitcast", "broadcast", "reshape", "constant",
                                         "parameter", "iota", "tuple", "get-tuple-element"}


def _same_index(ctx: _Context, k: Kernel) -> bool:
  found = ctx._same.get(k.name)
  if found is None:
    inst = ctx.inst(k)
    if inst.opcode == "fusion":
      found = k.kind is KernelKind.LOOP_FUSION and set(k.fused_ops) <= _SAME_INDEX_OPS
    else:
      found = inst.opcode in opcodes.ELEMENTWISE
    ctx._same[k.name] = found
  return found


def _operand_producers(ctx: _Context, k: Kernel) -> tuple[tuple[str, ...], ...]:
  """For each operand of `k`, the kernels whose outputs it holds."""
  found = ctx._inputs.get(k.name)
  if found is None:
    holds, kernels = ctx.dataflow.holds, ctx.kernels
    found = ctx._inputs[k.name] = tuple(
        tuple(vid[0] for _, vid in holds.get(o, ()) if vid[0] in kernels)
        for o in ctx.inst(k).operands)
  return found


def _depends_on(ctx: _Context, consumer: Kernel, anchor: str, operand: int,
                depth: int = 8) -> bool:
  """Whether an operand of `consumer` other than `operand` is computed from
  `anchor`'s output through a kernel that mixes elements (a BatchNorm apply
  reads the conv output and its batch statistics, reductions of that
  output; an activation's backward reads the incoming gradient): such work
  needs the whole result first and cannot be an epilogue. A path through
  elementwise kernels only (GELU split over two fusions) is same-index work
  one epilogue can do."""
  if "transpose(" in consumer.op_name and anchor in ctx.kernels and \
      "transpose(" not in ctx.kernels[anchor].op_name:
    return True  # a backward reader of a forward result needs the gradients
  # (kernel, whether the path from it back to here mixed elements)
  frontier: set[tuple[str, bool]] = {
      (p, False) for i, producers in enumerate(_operand_producers(ctx, consumer))
      if i != operand for p in producers}
  seen: set[tuple[str, bool]] = set()
  for _ in range(depth):
    if (anchor, True) in frontier:
      return True
    nxt = set()
    for name, mixed in frontier - seen:
      seen.add((name, mixed))
      if name == anchor:
        continue
      k = ctx.kernels[name]
      mixed = mixed or not _same_index(ctx, k)
      for producers in _operand_producers(ctx, k):
        for p in producers:
          if (p, mixed) not in seen:
            nxt.add((p, mixed))
    if not nxt:
      return False
    frontier = nxt
  return (anchor, True) in frontier


def _epilogue_work(ctx: _Context, consumer: Kernel, operand: int,
                   anchor_buf: Buffer, slices: bool = False) -> tuple[str, ...] | None:
  """What `consumer` does to its operand `operand` (the anchor's output), as
  epilogue items ("bias", "activation:gelu", "residual", "cast:bf16", ...);
  None when it does more than elementwise work on it. With `slices`, a
  slice is elementwise work too ("slice": the anchor stores that part; a
  convolution's input gradient padded as its forward input was)."""
  inst = ctx.inst(consumer)
  if inst.opcode in opcodes.ELEMENTWISE and inst.opcode != "copy":
    comp = ctx.comps[consumer.computation]
    return _classify_elementwise(comp, [inst], {}, anchor_buf)
  fused = _fused(ctx, consumer)
  # XLA:GPU runs elementwise work that transposes as an input fusion (the
  # transpose emitter): an epilogue too, where it reduces and scatters nothing.
  if fused is None or not (consumer.kind is KernelKind.LOOP_FUSION or (
      consumer.kind is KernelKind.INPUT_FUSION and
      not {"reduce", "reduce-window", "scatter"} & set(consumer.fused_ops))):
    return None
  params = {p.parameter_number: p for p in fused.parameters}
  if operand not in params:
    return None
  # Everything reachable from the anchor's parameter must be elementwise (or
  # shape-only: bitcast/reshape/broadcast of other operands is fine).
  users: dict[str, list[Instruction]] = {}
  for i in fused.instructions:
    for o in i.operands:
      users.setdefault(o, []).append(i)
  chain: list[Instruction] = []
  stack = [params[operand].name]
  seen = set()
  while stack:
    name = stack.pop()
    for u in users.get(name, ()):
      if u.name in seen:
        continue
      seen.add(u.name)
      if u.opcode in opcodes.ELEMENTWISE or u.opcode in (
          "bitcast", "reshape", "tuple", "transpose") or (slices and u.opcode == "slice"):
        chain.append(u)
        stack.append(u.name)
      else:
        return None
  work = _classify_elementwise(fused, chain, params, anchor_buf,
                               anchor_param=params[operand].name)
  if any(u.opcode == "slice" for u in chain):
    work = ("slice",) + tuple(w for w in work if w != "elementwise")
  # A reader writing several results of the value (adam's parameter and both
  # moments) needs an epilogue that writes them all.
  root = fused.root
  outputs = sum(o in seen for o in root.operands) if root.opcode == "tuple" else 1
  return ((f"outputs:{outputs}",) + work) if outputs > 1 else work


def _outputs_of(work: Sequence[str]) -> int:
  """The outputs an epilogue's work writes ("outputs:3" -> 3; else 1)."""
  return next((int(w.partition(":")[2]) for w in work if w.startswith("outputs:")), 1)


def _classify_elementwise(comp: Computation, chain: list[Instruction],
                          params: Mapping[int, Instruction],
                          anchor_buf: Buffer, anchor_param: str = "") -> tuple[str, ...]:
  names = {_primitive(i) for i in chain}
  opcodes_ = {i.opcode for i in chain}
  items: list[str] = []
  # The anchor's own value and everything computed from it are not "other"
  # operands (a bias or residual comes from elsewhere).
  chain_names = {i.name for i in chain} | {anchor_param}
  out_dims = anchor_buf.dims
  # Bias, residual and scale act on the anchor's value itself (or on a bias
  # or scale of it) as that value's only use, with an operand from outside
  # the chain. Ops past a value used twice belong to the activation: GELU's
  # x * 0.7071 and 0.5 * x * erf(..) are not scales.
  chain_uses: dict[str, int] = collections.Counter(
      o for i in chain for o in set(i.operands))
  direct = {anchor_param}
  changed = True
  while changed:
    changed = False
    for i in chain:
      if i.name in direct or i.opcode not in (
          "add", "subtract", "multiply", "bitcast", "reshape", "convert"):
        continue
      inputs = [o for o in i.operands if o in chain_names]
      if len(inputs) == 1 and inputs[0] in direct and chain_uses[inputs[0]] == 1:
        direct.add(i.name)
        changed = True
  # Bias / residual: an add whose other operand does not come from the chain.
  for i in chain:
    if i.opcode not in ("add", "subtract") or i.name not in direct:
      continue
    for o in i.operands:
      if o in chain_names or o not in comp:
        continue
      # (A bias kept in f32 is cast to the matmul's bf16 before or after
      # its broadcast.)
      other = _through_converts(comp, comp.instruction(o))
      if other.opcode == "broadcast" and other.operands:
        src = comp.instruction(other.operands[0]) if other.operands[0] in comp else None
        src = _through_converts(comp, src) if src is not None else None
        if src is not None and src.opcode in ("parameter", "constant") and \
            src.shape is not None and src.shape.num_elements < max(1, _prod(out_dims)):
          items.append("bias")
      elif other.opcode == "constant":
        items.append("bias")
      elif other.opcode == "parameter" and other.shape is not None and \
          other.shape.num_elements == _prod(out_dims):
        items.append("residual")
  # Scale: a multiply by a non-constant scalar or vector operand; a product
  # with another full-size tensor is not an epilogue a matmul kernel takes.
  for i in chain:
    if i.opcode != "multiply" or i.name not in direct:
      continue
    for o in i.operands:
      if o in chain_names or o not in comp:
        continue
      other = comp.instruction(o)
      base = other
      while base.opcode in ("broadcast", "bitcast", "reshape") and base.operands:
        base = comp.instruction(base.operands[0])
      if base.opcode == "constant":
        items.append("scale")
      elif base.opcode == "parameter" and base.shape is not None:
        if base.shape.num_elements < _prod(out_dims):
          items.append("scale")
        else:
          items.append("product")
  activation = _activation(names, opcodes_, comp, chain)
  if activation:
    items.append(f"activation:{activation}")
  if "clamp" in opcodes_ or ("maximum" in opcodes_ and "minimum" in opcodes_):
    items.append("clamp")
  # A mask selects by a predicate computed elsewhere (ReLU's backward:
  # select(x > 0, g, 0) with x from the forward pass); a select on the
  # anchor's own value belongs to the activation (XLA's erf expansion).
  if any(i.opcode == "select" and i.operands and i.operands[0] not in chain_names
         for i in chain):
    items.append("mask")
  if "transpose" in opcodes_:
    items.append("transpose")
  converts = [i for i in chain if i.opcode == "convert" and i.shape is not None]
  for c in converts:
    t = c.shape.element_type
    if dtypes.is_integral(t) or t.startswith("f8"):
      items.append(f"quantize:{t}")
    elif t != anchor_buf.dtype:
      items.append(f"cast:{t}")
  return tuple(dict.fromkeys(items)) or ("elementwise",)


def _through_converts(comp: Computation, inst: Instruction) -> Instruction:
  while inst.opcode == "convert" and inst.operands and inst.operands[0] in comp:
    inst = comp.instruction(inst.operands[0])
  return inst


def _activation(names: set[str], ops: set[str], comp: Computation,
                chain: list[Instruction]) -> str | None:
  if names & {"erf", "erfc"} or "erf" in ops:
    return "gelu"
  if "tanh" in names or "tanh" in ops:
    if names & {"integer_pow", "pow"} or _cubes(chain):
      return "gelu_tanh"  # tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))
    if _sigmoid_input(comp, chain) is not None:
      return "sigmoid+tanh"  # a recurrent cell's gates (LSTM, GRU)
    return "tanh"
  sigmoid = _sigmoid_input(comp, chain)
  if sigmoid is not None:
    by_name = {i.name: i for i in chain}
    gated = any(i.opcode == "multiply" and sigmoid[0] in i.operands
                and sigmoid[1] in i.operands for i in by_name.values())
    return "silu" if gated else "sigmoid"
  # A relu acts on the data itself: a maximum with zero on a smaller value
  # is a clamp of statistics (a norm's variance, max(E[x^2] - E[x]^2, 0)).
  widest = max((i.shape.num_elements for i in chain if i.opcode in opcodes.ELEMENTWISE
                and i.shape is not None and i.shape.is_array), default=0)
  for i in chain:
    if i.opcode == "maximum" and i.shape is not None and i.shape.is_array and \
        i.shape.num_elements == widest:
      for o in i.operands:
        if o in comp and _is_zero(comp, comp.instruction(o)):
          return "relu"
  return None


def _cubes(chain: list[Instruction]) -> bool:
  """Whether the chain multiplies a value by its own square (x * (x * x))."""
  squares = {i.name: i.operands[0] for i in chain
             if i.opcode == "multiply" and len(i.operands) == 2 and
             i.operands[0] == i.operands[1]}
  return any(i.opcode == "multiply" and len(i.operands) == 2 and
             any(squares.get(a) == b for a, b in (i.operands, i.operands[::-1]))
             for i in chain)


def _sigmoid_input(comp: Computation,
                   chain: list[Instruction]) -> tuple[str, str] | None:
  """(x, sigmoid(x)) when the chain computes a sigmoid: `logistic(x)`, or
  JAX's `1 / (1 + exp(-x))` as jax.nn.silu lowers it."""
  def base(name: str) -> Instruction | None:
    inst = comp.instruction(name) if name in comp else None
    while inst is not None and inst.opcode in ("bitcast", "reshape") and inst.operands:
      inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
    return inst

  for i in chain:
    if i.opcode == "logistic" and i.operands:
      return i.operands[0], i.name
    if i.opcode != "divide" or len(i.operands) != 2:
      continue
    den = base(i.operands[1])
    if den is None or den.opcode != "add":
      continue
    for o in den.operands:
      e = base(o)
      if e is not None and e.opcode == "exponential" and e.operands:
        n = base(e.operands[0])
        if n is not None and n.opcode == "negate" and n.operands:
          return n.operands[0], i.name
  return None


def _is_zero(comp: Computation, inst: Instruction) -> bool:
  while inst.opcode in ("broadcast", "bitcast") and inst.operands:
    inst = comp.instruction(inst.operands[0])
  return inst.opcode == "constant" and (inst.literal or "").strip() in ("0", "-0", "0.0")


def _prod(dims) -> int:
  n = 1
  for d in dims:
    n *= max(d, 0)
  return n


def _epilogues(ctx: _Context) -> tuple[list[FusionDecisionRecord], list[FusionDecisionRecord]]:
  out: list[FusionDecisionRecord] = []
  already: list[FusionDecisionRecord] = []
  for k in ctx.kernels.values():
    anchor = _anchor(ctx, k)
    if anchor is None:
      continue
    inst = ctx.inst(k)
    fused_work = _anchor_fused_epilogue(ctx, k)
    if fused_work:
      already.append(_already_fused(ctx, k, anchor, fused_work))
    for buf in ctx.writes.get(k.name, ()):
      if buf.lifetime in (Lifetime.EXTERNAL_OUTPUT, Lifetime.WORKSPACE) or buf.internal:
        continue
      consumers = _consumer_kernels(ctx, buf)
      if len(consumers) > 1:
        multi = _multi_epilogue(ctx, k, anchor, buf, consumers)
        if multi is not None:
          out.append(multi)
        continue
      if len(consumers) != 1:
        continue
      consumer = consumers[0]
      operand = _operand_number(ctx, consumer, buf)
      if operand is None:
        continue
      if _depends_on(ctx, consumer, k.name, operand):
        continue  # needs statistics of the whole result: not an epilogue
      work = _epilogue_work(ctx, consumer, operand, buf)
      if work is None and _store_into_slice(ctx, consumer, buf):
        work = ("store into slice",)
      if work is None:
        work = _epilogue_work(ctx, consumer, operand, buf, slices=True)
      if work is None:
        continue
      low_precision = buf.dtype in ("bf16", "f16") or buf.dtype.startswith("f8")
      epilogue = bt.gemm_epilogue(inst)
      evidence = (f"{_kernel_desc(k)} writes its {anchor} result {buf.shape} to memory; "
                  f"{_kernel_desc(consumer)} reads it once to apply "
                  f"{', '.join(work)}")
      if epilogue is not None:
        evidence += f"; the library call's epilogue is {epilogue}"
      elif k.kind is KernelKind.CPU_LIBRARY_FUSION:
        evidence += "; the CPU library fusion (XNNPACK/oneDNN) takes the matmul alone"
      reasons = ["current element only (elementwise epilogue)"]
      if "bias" in work or "scale" in work:
        reasons.append("broadcast scalars or vectors (row/column parameters)")
      if "residual" in work:
        reasons.append("same-index tensors (the residual)")
      verdict = Verdict.SAFE
      if any(w.startswith("quantize") for w in work):
        reasons.append("per-row quantization scales need a full-row reduction "
                       "across output tiles (cross-tile communication)")
        verdict = Verdict.RISKY
      risks = ["register count: the epilogue's live values add to the accumulator's"]
      if any(w.startswith("activation") for w in work):
        risks.append("register spills: erf/tanh polynomials are long; check SASS")
      risks.append("store coalescing: the fused store must stay vectorized")
      if ctx.has_backward:
        risks.append("backward complexity: the fused op needs a custom VJP "
                     "(dAct fused with the bias gradient)")
      risks += list(_COMMON_RISKS)
      out.append(FusionDecisionRecord(
          kind=FindingKind.UNFUSED_EPILOGUE, producer=k.name,
          consumers=(consumer.name,), boundary=buf.name, boundary_shape=buf.shape,
          bytes_saved=_times(2 * buf.bytes, _trip(k)),
          launches_removed=_times(1, _trip(k)),
          extra_arithmetic="none: the epilogue's elementwise ops move into the "
                           "matmul's store",
          extra_resources=_resources(work),
          numerical_class=(NumericalClass.MORE_PRECISE if low_precision
                           else NumericalClass.SAME_OPS),
          guard="no kernel covers all of this epilogue",
          layout_effect=f"none: the result keeps layout {str(inst.shape.layout) if inst.shape is not None and inst.shape.layout else '{}'}",
          evidence=evidence, verdict=verdict, reasons=tuple(reasons),
          risks=tuple(risks), ops=work, trip_count=_trip(k),
          source=buf.source, computation=k.computation,
          need=KernelNeed(FindingKind.UNFUSED_EPILOGUE, anchor, work,
                          outputs=_outputs_of(work))))
  return out, already


def _slice_read(ctx: _Context, consumer: Kernel, buf: Buffer) -> int | None:
  """Bytes `consumer` reads of `buf` when it reads it only through slices
  (possibly after elementwise work on the whole, e.g. a gate fusion adding
  the bias before splitting the gates), else None."""
  operand = _operand_number(ctx, consumer, buf)
  fused = _fused(ctx, consumer)
  if operand is None or fused is None:
    return None
  params = {p.parameter_number: p for p in fused.parameters}
  if operand not in params:
    return None
  users: dict[str, list[Instruction]] = {}
  for i in fused.instructions:
    for o in dict.fromkeys(i.operands):
      users.setdefault(o, []).append(i)
  total, stack, seen = 0, [params[operand].name], set()
  while stack:
    name = stack.pop()
    if not users.get(name):
      return None  # the whole value reaches the output unsliced
    for u in users[name]:
      if u.name in seen:
        continue
      seen.add(u.name)
      if u.opcode == "slice" and u.shape is not None:
        total += u.shape.byte_size
      elif u.opcode == "bitcast" or (u.opcode in opcodes.ELEMENTWISE and
                                     u.shape is not None and u.shape.dims == buf.dims):
        stack.append(u.name)
      else:
        return None
  return total


def _store_into_slice(ctx: _Context, consumer: Kernel, buf: Buffer) -> bool:
  """Whether `consumer` only copies `buf` into a slice of another buffer
  (a dynamic-update-slice whose update is `buf`): the anchor could store
  there directly."""
  inst = ctx.inst(consumer)
  operand = _operand_number(ctx, consumer, buf)
  if operand is None:
    return False
  if inst.opcode == "dynamic-update-slice":
    return operand == 1
  fused = _fused(ctx, consumer)
  if fused is None:
    return False
  root = fused.root
  while root.opcode == "bitcast" and root.operands:
    root = fused.instruction(root.operands[0])
  if root.opcode == "pad" and root.operands:
    # Copied into a zero-padded buffer: the anchor could store into it.
    src = _through_bitcasts(fused, root.operands[0])
    return src is not None and src.opcode == "parameter" and \
        src.parameter_number == operand
  if root.opcode != "dynamic-update-slice" or len(root.operands) < 2:
    return False
  update = _through_bitcasts(fused, root.operands[1])
  return update is not None and update.opcode == "parameter" and \
      update.parameter_number == operand


def _multi_epilogue(ctx: _Context, k: Kernel, anchor: str, buf: Buffer,
                    consumers: list[Kernel]) -> FusionDecisionRecord | None:
  """A matmul result that several kernels read, each elementwise or through
  a slice (an LSTM's gate split, a fused QKV projection, a weight gradient
  read by an optimizer's two moment updates, bias+activation beside the
  activation's backward mask): one epilogue could write every reader's
  result, and the matmul's output is never stored. None when a reader does
  more than elementwise work on it (another matmul, a reduction: reuse)."""
  works: list[tuple[str, ...]] = []
  fused: list[Kernel] = []
  later: list[Kernel] = []
  read = 0
  for c in consumers:
    operand = _operand_number(ctx, c, buf)
    work = _epilogue_work(ctx, c, operand, buf) if operand is not None else None
    sliced = _slice_read(ctx, c, buf) if work is None else None
    if work is None and sliced is None:
      return None  # another matmul, a reduction: reuse the stored result
    if _depends_on(ctx, c, k.name, operand):
      later.append(c)  # elementwise, but with values computed from the result
      continue
    fused.append(c)
    works.append(work if work is not None else ("slice",))
    read += buf.bytes if work is not None else sliced
  if not fused or (len(fused) == 1 and not later):
    return None
  n = len(fused)
  stored = bool(later)
  if all(w == ("slice",) for w in works) and read <= buf.bytes and not stored:
    ops: tuple[str, ...] = (f"split:{n}",)
    what = (f"{n} kernels ({', '.join(c.name for c in fused)}) each read a "
            "disjoint slice of it (column blocks)")
  else:
    items = dict.fromkeys(w for work in works for w in work
                          if w != "slice" and not w.startswith("outputs:"))
    ops = (f"outputs:{sum(_outputs_of(w) for w in works)}",) + tuple(items)
    what = (f"{n} kernel{'s' if n > 1 else ''} read it elementwise ("
            + "; ".join(f"{c.name}: {', '.join(w)}" for c, w in zip(fused, works))
            + ")")
  if stored:
    what += (f"; {', '.join(c.name for c in later)} also read{'s' if len(later) == 1 else ''}"
             " it with values computed from the whole result (statistics, "
             "gradients), so the result stays stored: the saving is the "
             "fused readers' reads")
  saved = read + (0 if stored else buf.bytes)
  consumers = fused
  return FusionDecisionRecord(
      kind=FindingKind.UNFUSED_EPILOGUE, producer=k.name,
      consumers=tuple(c.name for c in consumers), boundary=buf.name,
      boundary_shape=buf.shape, bytes_saved=_times(saved, _trip(k)),
      launches_removed=_times(n, _trip(k)),
      extra_arithmetic=f"the {n} readers' elementwise work moves into the matmul's store",
      extra_resources=f"{n} output tiles per accumulator tile",
      numerical_class=NumericalClass.SAME_OPS,
      guard="no kernel yet: no kernel writes several outputs",
      layout_effect=f"the {anchor} writes {n} outputs instead of one",
      evidence=f"{_kernel_desc(k)} writes its {anchor} result {buf.shape}; {what}",
      verdict=Verdict.SAFE,
      reasons=("current element only: each output element depends on one "
               "accumulator element",),
      risks=("register count: several epilogues' live values per tile",
             "store coalescing: each output's store must stay vectorized",
             "cache reuse: the readers no longer share one stored result") + _COMMON_RISKS,
      ops=ops, kernel=None, trip_count=_trip(k), source=buf.source,
      computation=k.computation, boundary_kept=stored,
      need=KernelNeed(FindingKind.UNFUSED_EPILOGUE, anchor, ops, outputs=_outputs_of(ops)))


def _resources(work: tuple[str, ...]) -> str:
  parts = []
  if "bias" in work:
    parts.append("one bias vector tile")
  if "scale" in work:
    parts.append("the scale tile")
  if "residual" in work:
    parts.append("one residual tile read in the epilogue")
  if any(w.startswith("activation") for w in work):
    parts.append("activation temporaries per element")
  return ", ".join(parts) or "none expected"


def _already_fused(ctx: _Context, k: Kernel, anchor: str,
                   work: tuple[str, ...]) -> FusionDecisionRecord:
  inst = ctx.inst(k)
  epilogue = bt.gemm_epilogue(inst)
  if epilogue:
    evidence = f"{inst.custom_call_target} with epilogue={epilogue} fuses {', '.join(work)}"
  elif bt.conv_epilogue(inst):
    evidence = (f"{inst.custom_call_target} (cuDNN's fused convolution) computes the "
                f"convolution and {', '.join(work)} in one call")
  elif _split_k_site(ctx, k) is not None:
    evidence = (f"{_kernel_desc(k)} sums the gemm's split-K partial sums and applies "
                f"{', '.join(work)} in one kernel")
  else:
    evidence = f"{_kernel_desc(k)} computes the {anchor} and {', '.join(work)} in one kernel"
  shape = inst.shape.dtype_str if inst.shape is not None else ""
  return FusionDecisionRecord(
      kind=FindingKind.ALREADY_FUSED, producer=k.name, consumers=(),
      boundary="", boundary_shape=shape, bytes_saved=0, launches_removed=0,
      extra_arithmetic="none", extra_resources="none",
      numerical_class=NumericalClass.SAME_OPS, guard="n/a",
      layout_effect="none", evidence=evidence, verdict=Verdict.KEEP,
      reasons=("XLA already fused this epilogue",), risks=(), ops=work,
      kernel=None, trip_count=_trip(k), source=k.source, computation=k.computation)


# ------------------------------------------------ class 5: prologues ----


def _prologues(ctx: _Context) -> list[FusionDecisionRecord]:
  """Buffers written only for matmuls (one or several: a forward dot and
  the backward dots reading the same operand) by a kernel whose work the
  matmuls could do on load: casts, dequantization, scales, elementwise
  math, slices of a larger buffer."""
  out = []
  for k in ctx.kernels.values():
    if k.kind not in (KernelKind.LOOP_FUSION, KernelKind.UNFUSED_OP, KernelKind.COPY):
      continue
    inst = ctx.inst(k)
    for buf in ctx.writes.get(k.name, ()):
      if buf.lifetime in (Lifetime.EXTERNAL_OUTPUT, Lifetime.EXPANDED_BROADCAST) \
          or buf.internal:
        continue
      readers = _consumer_kernels(ctx, buf)
      anchors = []
      for c in readers:  # (the first reader that is no matmul settles it)
        a = _anchor(ctx, c) or _cast_for_matmuls(ctx, c)
        if a is None:
          break
        anchors.append(a)
      if not readers or len(anchors) < len(readers):
        continue
      anchor = anchors[0]
      work = _prologue_work(ctx, k, inst) or _slice_work(ctx, k, inst)
      if work is not None and set(anchors) & bt.LAYOUT_FIXED_ANCHORS:
        # The library's layout contract: its transpose is not a prologue.
        work = tuple(w for w in work if w != "transpose") or None
      if work is None:
        continue
      n = len(readers)
      names = ", ".join(_kernel_desc(c) for c in readers)
      saved = _prologue_saving(k, buf, n)
      if saved <= 0:
        continue  # each reader re-reading the inputs costs more than the buffer
      out.append(FusionDecisionRecord(
          kind=FindingKind.UNFUSED_PROLOGUE, producer=k.name,
          consumers=tuple(c.name for c in readers), boundary=buf.name,
          boundary_shape=buf.shape,
          bytes_saved=_times(saved, _trip(k)),
          launches_removed=_times(1, _trip(k)),
          extra_arithmetic="the prologue runs on each loaded tile (once per "
                           "reuse of the tile in the matmul)",
          extra_resources="converted operand tile in registers/shared memory",
          numerical_class=NumericalClass.SAME_OPS,
          guard="no kernel yet covers this prologue",
          layout_effect="none: the matmul reads the original operand",
          evidence=(f"{_kernel_desc(k)} writes {buf.shape} ({', '.join(work)}) "
                    f"that only {'matmuls read' if n > 1 else 'a matmul reads'}: "
                    f"{names} ({', '.join(dict.fromkeys(anchors))})" +
                    (f"; fused into each, the {n} readers read its inputs "
                     f"({k.bytes_read} B) instead: {(1 + n) * buf.bytes} B of writes "
                     f"and reads go, {(n - 1) * k.bytes_read} B of reads come"
                     if n > 1 else "")),
          verdict=Verdict.SAFE,
          reasons=("current element only: elementwise work on the loaded operand",
                   "broadcast scalars or vectors (scales, per-channel affine)"),
          risks=("load coalescing of the narrower input",
                 "reuse within tile: the conversion repeats per reuse")
          + (("each reading matmul repeats the prologue",) if n > 1 else ())
          + _COMMON_RISKS,
          ops=work, trip_count=_trip(k), source=buf.source,
          computation=k.computation,
          # Matmuls and convolutions reading one buffer share no kernel.
          need=(KernelNeed(FindingKind.UNFUSED_PROLOGUE, anchor, work)
                if len(set(anchors)) == 1 else None)))
  return out


def _prologue_saving(k: Kernel, buf: Buffer, readers: int) -> int:
  """Bytes a prologue fused into each of its `readers` saves: the buffer's
  write and its reads, and the producer's own reads, go; each reader then
  reads the producer's inputs instead (for one reader: two buffers' worth)."""
  return (1 + readers) * buf.bytes + k.bytes_read - readers * k.bytes_read


def _cast_for_matmuls(ctx: _Context, c: Kernel) -> str | None:
  """The anchor a reader feeds when it only converts dtype for matmuls (a
  bf16 value widened again for a dot XLA:CPU runs in f32) or only joins it
  with other parts for them (a concatenate the matmul reads), else None."""
  inst = ctx.inst(c)
  joins = "concatenate" in c.fused_ops and set(c.fused_ops) <= _SLICE_OPS | _SLICE_GLUE
  if not joins and (not is_layout_conversion(ctx.module, inst) or
                    kernel_permutes(ctx.module, ctx.comps[c.computation], inst)):
    return None
  anchors = {_anchor(ctx, r) for b in ctx.writes.get(c.name, ())
             for r in _consumer_kernels(ctx, b)}
  if not anchors or None in anchors or len(anchors) != 1:
    return None
  return anchors.pop()


def _slice_work(ctx: _Context, k: Kernel, inst: Instruction) -> tuple[str, ...] | None:
  """("dynamic-slice",) or ("slice",) for a kernel that only cuts a part of
  a buffer (an offset the matmul's loads could apply)."""
  ops = set(k.fused_ops) if inst.opcode == "fusion" else {inst.opcode}
  cut = ops & {"slice", "dynamic-slice"}
  if not cut or not ops <= cut | _SLICE_GLUE | _scalar_ops(ctx, k):
    return None
  return ("dynamic-slice",) if "dynamic-slice" in cut else ("slice",)


def _scalar_ops(ctx: _Context, k: Kernel) -> set[str]:
  """Opcodes a fusion runs only on scalars (a dynamic-slice's index
  arithmetic, e.g. a reversed scan's `n - 1 - i`)."""
  fused = _fused(ctx, k)
  if fused is None:
    return set()
  ranked = {i.opcode for i in fused.instructions
            if i.shape is not None and i.shape.is_array and i.shape.dims}
  return {i.opcode for i in fused.instructions} - ranked


#: Opcodes a prologue producer may run: elementwise math and shape-only ops.
_PROLOGUE_OPS = (opcodes.ELEMENTWISE | {"bitcast", "reshape", "broadcast", "transpose",
                                        "constant", "parameter", "iota"}) - {"rng"}


def _prologue_work(ctx: _Context, k: Kernel, inst: Instruction) -> tuple[str, ...] | None:
  """What a producer does to the operand it hands a matmul alone: "cast",
  "dequantize:s8", "scale", "transpose", or for general elementwise work
  "affine" (x * a + b with broadcast vectors, e.g. a BatchNorm apply),
  "activation:relu" and "elementwise"; None when it does more (reductions,
  gathers, another matmul)."""
  ops = dict(k.fused_ops) if inst.opcode == "fusion" else {inst.opcode: 1}
  if not ops or not set(ops) <= _PROLOGUE_OPS | {"pad"}:
    return None
  compute = set(ops) - {"bitcast", "reshape", "broadcast", "constant", "parameter",
                        "copy", "iota", "pad"}
  if not compute:
    # Zero padding alone (XLA pads a convolution's input when the library
    # takes only symmetric padding): the reader's loads can pad.
    return ("pad",) if "pad" in ops else None
  src_types = set()
  for o in inst.operands:
    shape = ctx.comps[k.computation].instruction(o).shape
    if shape is not None and shape.is_array:
      src_types.add(shape.element_type)
  narrow = {t for t in src_types if dtypes.is_integral(t) or t.startswith("f8")}
  simple = compute <= {"convert", "multiply", "transpose", "subtract", "bitcast-convert"}
  items = []
  if simple:
    if narrow and "multiply" in ops:
      items.append(f"dequantize:{sorted(narrow)[0]}")
    elif "convert" in ops:
      items.append("cast")
    elif "multiply" in ops:
      items.append("scale")
  else:
    fused = _fused(ctx, k)
    chain = list(fused.instructions) if fused is not None else [inst]
    names = ctx.primitives(k)  # every instruction of `chain`'s (memoized)
    if "broadcast" in ops and compute & {"multiply", "divide"} and \
        compute & {"add", "subtract"}:
      items.append("affine")  # x * a + b: a norm's apply
    elif "broadcast" in ops and compute & {"add", "subtract"}:
      items.append("bias")
    elif "broadcast" in ops and compute & {"multiply", "divide"}:
      items.append("scale")
    activation = _activation(names, set(ops), fused or ctx.comps[k.computation], chain)
    if activation:
      items.append(f"activation:{activation}")
    if "convert" in ops:
      items.append("cast")
    if not items:
      items.append("elementwise")
  if "transpose" in ops:
    items.append("transpose")
  if "pad" in ops:
    items.append("pad")
  return tuple(items) or None


# ------------------------------------------ class 6: separate reductions ----


def _is_reduction_kernel(ctx: _Context, r: Kernel) -> bool:
  inst = ctx.inst(r)
  if inst.opcode == "reduce" and bt.is_split_k_reduce(inst):
    return False
  if _split_k_site(ctx, r) is not None and r.fused_ops.get("reduce", 0) == 1:
    return False  # the gemm's own split-K sum (and its epilogue)
  # XLA:CPU lowers some column sums (bias gradients) to reduce-window.
  return inst.opcode in ("reduce", "reduce-window") or bool(
      {"reduce", "reduce-window"} & set(r.fused_ops)
      and not {"dot", "convolution"} & set(r.fused_ops)
      and r.kind is not KernelKind.PALLAS)


def _separate_reductions(ctx: _Context) -> list[FusionDecisionRecord]:
  """Buffers a separate reduction kernel re-reads: one record per buffer,
  naming every reduction that reads it."""
  # vid -> its reductions by name (names are unique: equal kernels are one
  # kernel, and comparing names avoids the dataclass's field-by-field __eq__).
  readers: dict[ValueId, dict[str, Kernel]] = {}
  # Values read as a gemm's split-K partial sums (each reader sums them).
  partials: set[ValueId] = set()
  for r in ctx.kernels.values():
    if not _is_reduction_kernel(ctx, r):
      continue
    for n, operand in enumerate(ctx.inst(r).operands):
      if not _feeds_reduce(ctx, r, n):
        continue  # read beside the reduction, or a gemm's partial sums summed alone
      for _, vid in ctx.dataflow.holds.get(operand, ()):
        readers.setdefault(vid, {}).setdefault(r.name, r)
        if _sums_partials(ctx, r, n):
          partials.add(vid)
  out = []
  for vid, by_name in readers.items():
    reductions = list(by_name.values())
    bid = ctx.dataflow.buffer_of.get(vid)
    if bid is None:
      continue
    buf = ctx.buffers.get(bid[0] + ("{" + ",".join(map(str, bid[1])) + "}" if bid[1] else ""))
    if buf is None or not buf.producer or buf.internal or buf.lifetime is Lifetime.INPUT:
      continue
    if vid in partials and len(buf.consumers) == 1:
      continue  # the one kernel finishing a split-K gemm reduces its result too
    # The kernel that wrote the value read: for a buffer updated in place
    # (a scatter-add into zeros) that is the last writer, not the first.
    producer = ctx.kernels.get(vid[0]) or ctx.kernels.get(buf.producer)
    if producer is None or producer.name in by_name:
      continue
    if all(_tree_stage(ctx, producer, buf, r) for r in reductions):
      continue  # XLA's reduction split in two kernels: one reduction
    others = [c for c in buf.consumers if c not in by_name and c != producer.name]
    if "transpose(" not in producer.op_name and all(
        "transpose(" in r.op_name for r in reductions):
      # Saved for backward: a backward reduction (dgamma = sum(dy * x_hat))
      # needs values the forward producer does not have yet; what can go is
      # the saved buffer itself, when the reduction can recompute it.
      saved = _saved_normalized(ctx, buf, producer, reductions, others)
      if saved is not None:
        out.append(saved)
      continue
    # A reduction that also reads values computed from this one (the next
    # layer's residual stream, the gradients) cannot run in the producer:
    # it reads the buffer as any later kernel does.
    # (A sibling statistic that itself needs later values makes its readers
    # later too: iterate to the fixpoint.)
    later: set[str] = set()
    while True:
      ready = frozenset(by_name) - later
      more = {r.name for r in reductions if r.name not in later and
              _needs_later_values(ctx, r, buf, producer, ready)}
      if not more:
        break
      later |= more
    if later:
      reductions = [r for r in reductions if r.name not in later]
      others = [c for c in buf.consumers if c not in by_name or c in later]
      others = [c for c in others if c != producer.name]
      if not reductions:
        continue
    whole = [r for r in reductions if _whole_normalization(ctx, r, buf)]
    if len(whole) == len(reductions):
      # XLA's own Triton softmax or norm: already one kernel. Only a fused
      # attention kernel removes the boundary, where a gemm feeds it and a
      # gemm reads it.
      chain = _attention_chain(ctx, buf, producer, reductions)
      if chain is not None:
        out.append(chain)
      continue
    if whole:  # read beside the others, as any reader (a norm's backward in one kernel)
      reductions = [r for r in reductions if r not in whole]
      others = others + [r.name for r in whole]
    only = not others and len(reductions) == 1
    stats = None
    pattern = None
    for r in reductions:
      stats = stats or _statistics(ctx, r, buf)
      pattern = pattern or _reduction_pattern(ctx, r, producer, stats, buf)
    if pattern == "contraction" and stats is not None:
      stats = dataclasses.replace(stats, affine=None)  # a weight, not a norm's scale
    # A pattern some kernel could compute asks the libraries; a norm's
    # backward pass is its forward kernel's business.
    need = (KernelNeed(FindingKind.SEPARATE_REDUCTION, pattern, statistics=stats)
            if pattern in _KERNEL_PATTERNS else None)
    trip = producer.trip_count
    saved = 2 * buf.bytes if only else buf.bytes * len(reductions)
    what = _reduction_text(pattern, stats, buf, any(
        "transpose(" in k.op_name for k in (producer, *reductions)))
    out.append(FusionDecisionRecord(
        kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
        consumers=tuple(r.name for r in reductions) + tuple(others),
        boundary=buf.name, boundary_shape=buf.shape,
        bytes_saved=_times(saved, trip),
        launches_removed=_times(1 if only else 0, trip),
        extra_arithmetic="per-tile partial reductions in the producer, and a "
                         "small final combine",
        extra_resources="one partial-accumulator row per tile",
        numerical_class=NumericalClass.REASSOCIATED,
        guard="keep XLA's reduction when tiles cannot span the axis",
        layout_effect="none",
        evidence=(f"{', '.join(_kernel_desc(r) for r in reductions)} re-read"
                  f"{'s' if len(reductions) == 1 else ''} {buf.shape} written by "
                  f"{_kernel_desc(producer)}" +
                  (f"; {len(others)} other kernel(s) read it too" if others else
                   "; no other kernel reads it") +
                  ("; it holds the gemm's split-K partial sums, which each reader sums "
                   "again" if vid in partials else "") + (f"; {what}" if what else "")),
        verdict=Verdict.SAFE if only else Verdict.RISKY,
        reasons=(("tile-local partial reductions",) if only else
                 ("tile-local partial reductions",
                  "other readers keep the buffer: only the re-reads go")),
        risks=("numerical: reassociated sums change the last bits",
               "shared/local memory for partials may lower occupancy") + _COMMON_RISKS,
        ops=(pattern or "reduce",), trip_count=trip,
        source=buf.source, computation=producer.computation, need=need))
  return out


def _feeds_reduce(ctx: _Context, r: Kernel, operand: int) -> bool:
  """Whether reduction kernel `r`'s operand `operand` reaches one of its
  reduces (not a scatter's destination, say, or an output written beside).
  A split-K sum is its gemm's: partial sums count where what they sum is
  reduced further (a norm's statistics over the gemm's result)."""
  fused = _fused(ctx, r)
  if fused is None:
    return True
  reached = _reached(ctx, fused, operand)
  return any(i.opcode in ("reduce", "reduce-window") and i.name in reached and
             not bt.is_split_k_reduce(i) for i in fused.instructions)


def _sums_partials(ctx: _Context, r: Kernel, operand: int) -> bool:
  """Whether `r` reads its operand `operand` as a gemm's split-K partial
  sums (only a split-K reduce reads it, through bitcasts)."""
  fused = _fused(ctx, r)
  param = next((p for p in fused.parameters if p.parameter_number == operand),
               None) if fused is not None else None
  if param is None:
    return False
  users, stack = [], [param.name]
  while stack:
    for u in ctx.users(fused, stack.pop()):
      if u.opcode == "bitcast":
        stack.append(u.name)
      else:
        users.append(u)
  return bool(users) and all(bt.is_split_k_reduce(u) for u in users)


def _tree_stage(ctx: _Context, producer: Kernel, buf: Buffer, r: Kernel) -> bool:
  """Whether `buf` holds partial results of one reduction XLA split over two
  kernels (a tree reduction: `producer` reduces part of the axes, `r`
  reduces the rest with the same reducer computation)."""
  found = fused_root(ctx.module, ctx.inst(producer), buf.index)
  if found is None:
    return False
  comp, root = found
  root = _through_bitcasts(comp, root.name) or root
  if root.opcode != "reduce":
    return False
  reducer = root.called_computations.get("to_apply", ())
  operand = _operand_number(ctx, r, buf)
  if not reducer or operand is None:
    return False
  # The second stage reduces the partial results themselves, with the same
  # reducer (not a value computed from them, as a variance from a mean).
  for where, i in _reduce_sites(ctx, r, operand):
    src = _through_moves(where, i.operands[0]) if i.operands else None
    if i.called_computations.get("to_apply", ()) == reducer and src is not None and \
        src.opcode == "parameter" and src.parameter_number == operand:
      return True
  return False


def _needs_later_values(ctx: _Context, r: Kernel, buf: Buffer, producer: Kernel,
                        siblings: frozenset[str]) -> bool:
  """Whether reduction `r` reads a value computed from `producer`'s output,
  other than the results of the reductions in `siblings` read directly (the
  other statistics of the same buffer, which one fused kernel computes too)."""
  start = producer.time
  inputs = _reduce_inputs(ctx, r, _operand_number(ctx, r, buf))
  frontier = {p for n, producers in enumerate(_operand_producers(ctx, r))
              if inputs is None or n in inputs
              for p in producers if p != producer.name and p not in siblings}
  seen: set[str] = set()
  while frontier:
    name = frontier.pop()
    if name in seen:
      continue
    seen.add(name)
    k = ctx.kernels[name]
    if k.time <= start or k.computation != producer.computation:
      continue  # ran before the producer (or elsewhere): not from its output
    for producers in _operand_producers(ctx, k):
      for p in producers:
        if p == producer.name:
          return True
        if p not in seen:
          frontier.add(p)
  return False


def _reduce_inputs(ctx: _Context, r: Kernel, operand: int | None) -> set[int] | None:
  """The operands of fusion `r` the inputs of the reduces that its operand
  `operand` reaches are computed from (not those applied to a reduced result
  only, nor those of other reductions the kernel runs beside); None for an
  unfused reduce."""
  fused = _fused(ctx, r)
  if fused is None:
    return None
  # The first reduces the operand reaches: what reduces their results is the
  # small final combine, after the partial reductions.
  mine = _reached(ctx, fused, operand, past_reduces=False) if operand is not None else \
      {i.name for i in fused.instructions}
  stack = [o for i in fused.instructions
           if i.name in mine and i.opcode in ("reduce", "reduce-window")
           and not bt.is_split_k_reduce(i)
           for o in i.operands[:max(1, len(i.operands) // 2)]]
  seen: set[str] = set()
  found: set[int] = set()
  while stack:
    name = stack.pop()
    if name in seen or name not in fused:
      continue
    seen.add(name)
    inst = fused.instruction(name)
    if inst.opcode == "parameter":
      found.add(inst.parameter_number)
    stack.extend(inst.operands)
  return found


def _whole_normalization(ctx: _Context, r: Kernel, buf: Buffer) -> bool:
  """Whether `r` is an XLA Triton fusion holding a whole softmax or norm
  over `buf`: its reductions and the elementwise apply in one kernel, writing
  a result of `buf`'s size."""
  if r.kind is not KernelKind.TRITON_FUSION or "reduce" not in r.fused_ops:
    return False
  shape = ctx.inst(r).shape
  return shape is not None and shape.is_array and \
      shape.num_elements == _prod(buf.dims)


#: The fused attention kernels a gemm -> softmax -> gemm chain needs.
ATTENTION_KERNELS = ('jax.nn.dot_product_attention(q, k, v, implementation="cudnn") '
                     "or a Pallas attention kernel")


def _attention_chain(ctx: _Context, buf: Buffer, producer: Kernel,
                     softmaxes: list[Kernel]) -> FusionDecisionRecord | None:
  """One finding for gemm -> (XLA's one-kernel softmax) -> gemm: the scores
  and the probabilities are both written and read back; a fused attention
  kernel keeps them on chip. None when no gemm sits on both sides."""
  if _anchor(ctx, producer) != "dot":
    return None
  probs = [b for r in softmaxes for b in ctx.writes.get(r.name, ())]
  readers = [c for b in probs for c in _consumer_kernels(ctx, b)]
  if not probs or not readers or not all(_anchor(ctx, c) == "dot" for c in readers):
    return None
  trip = producer.trip_count
  saved = 2 * buf.bytes + sum(2 * b.bytes for b in probs)
  backward = "transpose(" in producer.op_name
  return FusionDecisionRecord(
      kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
      consumers=tuple(r.name for r in softmaxes) + tuple(dict.fromkeys(c.name for c in readers)),
      boundary=buf.name, boundary_shape=buf.shape, bytes_saved=_times(saved, trip),
      launches_removed=_times(len(softmaxes) + 1, trip),
      extra_arithmetic="online softmax: running max and sum per row, rescaling "
                       "the accumulator",
      extra_resources="a query tile, key/value tiles and the running statistics "
                      "in shared memory and registers",
      numerical_class=NumericalClass.REASSOCIATED,
      guard="XLA's gemm, softmax and gemm where the fused kernel does not apply",
      layout_effect="none",
      evidence=(f"{_kernel_desc(producer)} writes "
                f"{'the gradient of the attention probabilities' if backward else 'the attention scores'} "
                f"{buf.shape}; "
                f"{', '.join(_kernel_desc(r) for r in softmaxes)} "
                f"{'computes' if len(softmaxes) == 1 else 'compute'} the whole "
                f"softmax{' backward' if backward else ''} in one kernel (XLA's own "
                f"Triton fusion, no separate reduction) and "
                f"{', '.join(dict.fromkeys(c.name for c in readers))} "
                f"{'reads' if len(readers) == 1 else 'read'} its result in a gemm: "
                f"gemm -> softmax -> gemm, which only a fused attention kernel "
                f"({ATTENTION_KERNELS}) keeps on chip"),
      verdict=Verdict.RISKY,
      reasons=("a separate algorithmic phase: the whole row of scores is needed, "
               "which a fused attention kernel streams with running statistics",),
      risks=("shared memory: key/value tiles and statistics lower occupancy",
             "backward complexity: the fused kernel needs its own backward") + _COMMON_RISKS,
      ops=("attention",), trip_count=trip, source=buf.source,
      computation=producer.computation,
      need=KernelNeed(FindingKind.SEPARATE_REDUCTION, "attention"))


def _reduce_sites(ctx: _Context, r: Kernel,
                  operand: int | None = None) -> list[tuple[Computation, Instruction]]:
  """The reduce and reduce-window instructions a reduction kernel runs (a
  split-K sum is its gemm's, not one of them); with `operand`, those its
  operand `operand` reaches, where it reaches any."""
  inst = ctx.inst(r)
  comp = ctx.comps[r.computation]
  sites = [(comp, inst)] if inst.opcode in ("reduce", "reduce-window") else []
  fused = _fused(ctx, r)
  if fused is not None:
    sites += [(fused, i) for i in fused.instructions
              if i.opcode in ("reduce", "reduce-window") and not bt.is_split_k_reduce(i)]
    if operand is not None:
      reached = _reached(ctx, fused, operand)
      mine = [(c, i) for c, i in sites if i.name in reached]
      sites = mine or sites
  return sites


def _reached(ctx: _Context, fused: Computation, operand: int,
             past_reduces: bool = True) -> set[str]:
  """Instructions of `fused` computed from its parameter `operand`; without
  `past_reduces`, up to the first reduces (a split-K sum is no stop: it
  finishes a gemm) and not what is computed from their results."""
  param = next((p for p in fused.parameters if p.parameter_number == operand), None)
  if param is None:
    return set()
  seen: set[str] = set()
  stack = [param.name]
  while stack:
    for u in ctx.users(fused, stack.pop()):
      if u.name not in seen:
        seen.add(u.name)
        if past_reduces or u.opcode not in ("reduce", "reduce-window") or \
            bt.is_split_k_reduce(u):
          stack.append(u.name)
  return seen


def _reduced_dims(comp: Computation, inst: Instruction) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
  """(operand dims, reduced axes) of a reduce; for a reduce-window, the axes
  its window spans. A reduce of another reduce's result in the same
  computation (XLA reduces dims {0,2} as {2}, then {0}) counts as one,
  over the first one's operand."""
  if not inst.operands or inst.operands[0] not in comp:
    return None
  src = comp.instruction(inst.operands[0])
  shape = src.shape
  if shape is None or not shape.is_array:
    return None
  dims = tuple(shape.dims)
  if inst.opcode == "reduce":
    if inst.dimensions is None:
      return None
    axes = tuple(sorted(inst.dimensions))
    inner = _through_same_shape(comp, src)
    if inner is not None and inner.opcode == "reduce" and not bt.is_split_k_reduce(inner):
      first = _reduced_dims(comp, inner)
      if first is not None:
        kept = [a for a in range(len(first[0])) if a not in first[1]]
        if len(kept) == len(dims):
          return first[0], tuple(sorted(set(first[1]) | {kept[a] for a in axes}))
    return dims, axes
  window = inst.window
  if window is None or len(window) != len(dims):
    return None
  return dims, tuple(a for a, w in enumerate(window) if w.size > 1)


def _through_same_shape(comp: Computation, inst: Instruction) -> Instruction:
  """The instruction behind `inst` through elementwise ops of one operand
  that keep its dims (a scale or negation between two reduces)."""
  while inst.opcode in opcodes.ELEMENTWISE and inst.operands and inst.shape is not None:
    srcs = [comp.instruction(o) for o in inst.operands if o in comp]
    full = [s for s in srcs if s.shape is not None and s.shape.dims == inst.shape.dims
            and s.opcode not in ("broadcast", "constant")]
    if len(full) != 1:
      break
    inst = full[0]
  return inst


def _map_axes(src: tuple[int, ...], axes: tuple[int, ...],
              dst: tuple[int, ...]) -> tuple[int, ...] | None:
  """`axes` of `src` as axes of `dst`, a reshape of it, where the reduced
  axes are a leading or trailing run whose element count `dst` splits the
  same way (e.g. {1} of [128,64] is {2} of [8,16,64]); None otherwise."""
  if src == dst:
    return axes
  if _prod(src) != _prod(dst) or not axes:
    return None
  n = _prod(src[a] for a in axes)
  if axes == tuple(range(len(src) - len(axes), len(src))):
    for k in range(len(dst), 0, -1):
      if _prod(dst[k - 1:]) == n:
        return tuple(range(k - 1, len(dst)))
  elif axes == tuple(range(len(axes))):
    for k in range(1, len(dst) + 1):
      if _prod(dst[:k]) == n:
        return tuple(range(k))
  return None


def _statistics(ctx: _Context, r: Kernel, buf: Buffer) -> Statistics | None:
  """What the reduction kernel's widest reduce of `buf` reduces (the widest
  of all its reduces where none reads `buf`), in `buf`'s dims where the two
  are reshapes of each other, with the scale applied beside."""
  best = None
  for comp, inst in _reduce_sites(ctx, r, _operand_number(ctx, r, buf)):
    found = _reduced_dims(comp, inst)
    if found is not None and (best is None or (len(found[0]), len(found[1])) >
                              (len(best[0]), len(best[1]))):
      best = found
  if best is None:
    return None
  dims, axes = best
  mapped = _map_axes(dims, axes, tuple(buf.dims))
  if mapped is not None:
    dims, axes = tuple(buf.dims), mapped
  return Statistics(dims, axes, _affine(ctx, r, buf, dims, axes))


def _affine(ctx: _Context, r: Kernel, buf: Buffer, dims: tuple[int, ...],
            axes: tuple[int, ...]) -> tuple[int, ...] | None:
  """The dims of a scale broadcast over exactly the reduced axes (gamma) in
  the kernels around the reduction: the boundary's readers and the readers
  of what the reduction writes."""
  holders = _broadcast_scales(ctx).get((dims, axes))
  if not holders:
    return None
  near = {c for c in buf.consumers} | {c for b in ctx.writes.get(r.name, ())
                                       for c in b.consumers}
  near |= {c for name in tuple(near) for b in ctx.writes.get(name, ())
           for c in b.consumers}
  found = [name for name in holders if name in near]
  return holders[min(found)] if found else None


def _broadcast_scales(ctx: _Context) -> dict:
  """(dims, broadcast dims) -> {kernel name: source dims} of the fusion
  parameters each kernel broadcasts so (the first of each kind in a kernel,
  in text order), built once per audit."""
  if "table" in ctx._scales:
    return ctx._scales["table"]
  table: dict = {}
  for k in ctx.kernels.values():
    fused = _fused(ctx, k)
    for i in fused.instructions if fused is not None else ():
      if i.opcode != "broadcast" or i.shape is None or not i.operands:
        continue
      by_kernel = table.setdefault((tuple(i.shape.dims), tuple(i.dimensions or ())), {})
      if k.name in by_kernel:
        continue
      src = _through_bitcasts(fused, i.operands[0])
      if src is not None and src.opcode == "parameter":
        by_kernel[k.name] = tuple(src.shape.dims)
  ctx._scales["table"] = table
  return table


def _reduction_pattern(ctx: _Context, r: Kernel, producer: Kernel,
                       stats: Statistics | None, buf: Buffer) -> str | None:
  """What a reduction computes, judged by its axes first and its ops second:
  "layer_norm", "rms_norm", "softmax" or "log_softmax" for a forward
  reduction over trailing axes; "norm_backward" for such a reduction in the
  backward pass; over other axes, "batch_norm_stats" (the batch axis
  reduced, into an rsqrt), "group_norm_stats" (per sample: the batch axis
  kept, into an rsqrt), "contraction" (a product of `buf` with a value that
  varies along the reduced axes: an einsum XLA runs as multiply + reduce;
  over the leading axes in the backward pass that is a gradient),
  "column_reduction" (the leading axes: a bias or gamma gradient, a pooled
  sum) or None (described by its axes alone)."""
  # What reads the reduction's result: statistics feed an rsqrt there (the
  # producer's own ops say nothing: x_hat holds an rsqrt too).
  after = set(ctx.primitives(r))
  for b in ctx.writes.get(r.name, ()):
    for c in b.consumers:
      if c in ctx.kernels:
        after |= ctx.primitives(ctx.kernels[c])
  names = after | ctx.primitives(producer)
  backward = "transpose(" in r.op_name or "transpose(" in producer.op_name
  if stats is not None:
    rank, axes = len(stats.dims), stats.axes
    trailing = bool(axes) and axes == tuple(range(rank - len(axes), rank)) and len(axes) < rank
    if not trailing:
      if "rsqrt" in after and not backward:
        return "batch_norm_stats" if 0 in axes else "group_norm_stats"
      leading = rank >= 2 and axes == tuple(range(len(axes)))
      if (not leading or not backward) and _contracts(ctx, r, buf):
        return "contraction"
      if leading:
        return "column_reduction"
      return None
  if backward:
    return "norm_backward" if "rsqrt" in names else None
  if "rsqrt" in names:
    return "layer_norm" if names & {"sub", "subtract"} else "rms_norm"
  if names & {"exp", "exponential"} and names & {"reduce_max", "max"}:
    # log_softmax (cross-entropy) takes the log of the sum: not a softmax.
    return "log_softmax" if names & {"log", "log_softmax"} else "softmax"
  # A matrix-vector product XLA runs as multiply + reduce (a Dense(1)).
  return "contraction" if _contracts(ctx, r, buf) else None


def _contracts(ctx: _Context, r: Kernel, buf: Buffer) -> bool:
  """Whether `r` reduces a product of `buf` with another value that varies
  along the reduced axes (an einsum contraction such as mixing experts'
  outputs by their weights), not a sum or a scaled sum of `buf` alone."""
  operand = _operand_number(ctx, r, buf)
  fused = _fused(ctx, r)
  if operand is None or fused is None:
    return False
  reached = _reached(ctx, fused, operand, past_reduces=False)
  for comp, red in _reduce_sites(ctx, r, operand):
    if red.opcode != "reduce" or red.name not in reached or not red.dimensions:
      continue
    prod = _through_moves(comp, red.operands[0])
    if prod is None or prod.opcode != "multiply" or prod.shape is None or \
        len(set(prod.operands)) != 2:
      continue  # (x * x is a square: a sum of squares, no contraction)
    axes = set(red.dimensions)
    if all(_varies_along(comp, o, axes, prod.shape.dims) for o in prod.operands):
      return True
  return False


def _varies_along(comp: Computation, name: str, axes: set[int],
                  dims: Sequence[int]) -> bool:
  """Whether operand `name` (of an instruction with `dims`) varies along any
  of `axes`: a constant does not, nor a broadcast that maps no source axis
  onto them."""
  inst = comp.instruction(name) if name in comp else None
  while inst is not None and inst.opcode in ("convert", "copy") and inst.operands:
    inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  if inst is None or inst.opcode == "constant":
    return False
  if inst.opcode == "broadcast" and inst.shape is not None and \
      tuple(inst.shape.dims) == tuple(dims):
    return bool(set(inst.dimensions or ()) & axes)
  return True


#: Patterns a kernel library may compute (the others have no kernel, by
#: design: a backward pass is its forward kernel's business).
_KERNEL_PATTERNS = frozenset({"layer_norm", "rms_norm", "softmax", "log_softmax",
                              "attention",
                              "batch_norm_stats", "group_norm_stats",
                              "column_reduction"})

#: What the reduction patterns are, for the evidence (the axes follow).
_PATTERN_TEXT = {
    "batch_norm_stats": "batch-norm statistics (the batch axis reduced, per channel)",
    "group_norm_stats": ("per-sample statistics (the batch axis kept): a group or "
                         "instance norm"),
    "column_reduction": ("a reduction over the leading axes (a bias, gamma or weight "
                         "gradient)"),
    "column_reduction:forward": ("a reduction over the leading axes in the forward "
                                 "pass (a sum or mean over the batch: routing "
                                 "counts, a pooled mean)"),
    "log_softmax": "a log-softmax (e.g. inside a cross-entropy loss)",
    "contraction": ("a product summed over the reduced axes: an einsum contraction "
                    "XLA runs as multiply + reduce (e.g. mixing experts' outputs by "
                    "their routing weights)"),
    "norm_backward": ("a normalization's backward pass; no kernel suggested: "
                      "the forward op's kernel brings its own backward"),
}


def _reduction_text(pattern: str | None, stats: Statistics | None, buf: Buffer,
                    backward: bool) -> str:
  """What the HLO reduces, in words: the pattern (where one is known) and
  the axes, e.g. "per-sample statistics ...: reduces dims {1,2,4} of
  [8,32,32,8,4] (batch axis 0 kept; one result per index of axes 0,3)"."""
  key = f"{pattern}:forward" if not backward and f"{pattern}:forward" in _PATTERN_TEXT \
      else pattern
  parts = [_PATTERN_TEXT[key]] if key in _PATTERN_TEXT else []
  if stats is not None and pattern not in ("layer_norm", "rms_norm", "softmax"):
    kept = stats.kept
    # A contraction's axes are the einsum's (experts, heads): axis 0 need
    # not be the batch.
    batch = ("" if len(stats.dims) < 2 or pattern == "contraction" else
             "batch axis 0 kept" if 0 in kept else "batch axis 0 reduced")
    per = (f"one result per index of axes {_axes_text(kept)}" if kept else
           "one result")
    parts.append(f"reduces {stats.describe().replace(' per statistic', ' each')} "
                 f"({', '.join(p for p in (batch, per) if p)})")
  return ": ".join(parts)


def _axes_text(axes: Sequence[int]) -> str:
  return "{" + ",".join(map(str, axes)) + "}"


def _saved_normalized(ctx: _Context, buf: Buffer, producer: Kernel,
                      reductions: list[Kernel],
                      others: list[str]) -> FusionDecisionRecord | None:
  """x_hat (or x - mean) written by the forward pass for one backward
  reduction that multiplies it by the incoming gradient and reduces (a gamma
  gradient, a norm's backward term): the reduction can recompute it from x
  and the per-row statistics, so the buffer is never written or kept."""
  if others or len(reductions) != 1:
    return None
  r = reductions[0]
  if not _reads_statistics(ctx, producer, buf) or not _multiplies_then_reduces(ctx, r, buf):
    return None
  sole = len(ctx.writes.get(producer.name, ())) == 1
  # The reader loads x instead of x_hat: where the producer runs on for its
  # other outputs, that load is new traffic.
  added = 0 if sole else max((_operand_bytes(ctx, producer, o)
                              for o in range(len(ctx.inst(producer).operands))),
                             default=0)
  trip = producer.trip_count
  stats = _statistics(ctx, r, buf)
  axes = f" ({stats.describe()})" if stats is not None else ""
  return FusionDecisionRecord(
      kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
      consumers=(r.name,), boundary=buf.name, boundary_shape=buf.shape,
      bytes_saved=_times(max(0, 2 * buf.bytes - added), trip),
      launches_removed=_times(1 if sole else 0, trip),
      extra_arithmetic="the reduction recomputes (x - mean) * rstd on load",
      extra_resources="the per-row statistics tile",
      numerical_class=NumericalClass.SAME_OPS,
      guard="keep the saved buffer where x itself is not kept for the backward pass",
      layout_effect="none",
      evidence=(f"{_kernel_desc(producer)} writes {buf.shape} in the forward pass from "
                f"x and its statistics, and only {_kernel_desc(r)} reads it, in the "
                f"backward pass, multiplying it by the incoming gradient and reducing"
                f"{axes}: a normalized input saved for one reduction"),
      verdict=Verdict.SAFE,
      reasons=("cheap recomputation: x_hat from x and compact statistics",
               "tile-local partial reductions"),
      risks=("peak: x must be kept for the backward pass instead",) + _COMMON_RISKS,
      ops=("norm_backward", "recompute x_hat"), trip_count=trip, source=buf.source,
      computation=producer.computation)


def _reads_statistics(ctx: _Context, producer: Kernel, buf: Buffer) -> bool:
  """Whether `producer` combines a full-size input with a smaller value a
  reduction wrote (a mean, an rstd): how x_hat and x - mean are made."""
  for producers in _operand_producers(ctx, producer):
    for p in producers:
      k = ctx.kernels.get(p)
      if k is None:
        continue
      small = any(b.bytes < buf.bytes for b in ctx.writes.get(p, ()))
      if small and (_is_reduction_kernel(ctx, k) or "rsqrt" in ctx.primitives(k)):
        return True
  return False


def _multiplies_then_reduces(ctx: _Context, r: Kernel, buf: Buffer) -> bool:
  """Whether the reduction multiplies `buf` by another full-size operand
  (the incoming gradient) before reducing."""
  fused = _fused(ctx, r)
  operand = _operand_number(ctx, r, buf)
  if fused is None or operand is None:
    return False
  params = {p.parameter_number: p for p in fused.parameters}
  if operand not in params:
    return False
  mine = params[operand].name
  for i in fused.instructions:
    if i.opcode != "multiply" or mine not in i.operands:
      continue
    other = [o for o in i.operands if o != mine]
    src = _through_bitcasts(fused, other[0]) if other else None
    if src is not None and src.opcode == "parameter" and src.shape is not None and \
        src.shape.num_elements == _prod(buf.dims):
      return True
  return False


def _operand_bytes(ctx: _Context, k: Kernel, operand: int) -> int:
  name = ctx.inst(k).operands[operand]
  return sum(ctx.dataflow.values[v].byte_size for _, v in ctx.dataflow.holds.get(name, ()))


# ----------------------------------- class 7: materialized slices, concats ----

#: Ops of a kernel that only cuts or joins data.
_SLICE_OPS = frozenset({"slice", "dynamic-slice", "concatenate"})
_SLICE_GLUE = frozenset({"bitcast", "reshape", "copy", "parameter", "constant",
                         "broadcast", "tuple", "convert"})


def _materialized_slices(ctx: _Context) -> list[FusionDecisionRecord]:
  """A slice, dynamic-slice or concatenate written to memory for one
  reader, or for several elementwise readers, that could read the parts in
  place (matmuls reading a slice are unfused prologues)."""
  out = []
  for k in ctx.kernels.values():
    if k.kind is KernelKind.PALLAS:
      continue
    inst = ctx.inst(k)
    ops = set(k.fused_ops) if inst.opcode == "fusion" else {inst.opcode}
    cut = ops & _SLICE_OPS
    if not cut or not ops <= _SLICE_OPS | _SLICE_GLUE | _scalar_ops(ctx, k):
      continue
    for buf in ctx.writes.get(k.name, ()):
      if buf.internal or buf.lifetime is Lifetime.EXTERNAL_OUTPUT:
        continue
      consumers = _consumer_kernels(ctx, buf)
      if not consumers:
        continue
      if len(consumers) > 1 and not all(
          c.kind in (KernelKind.LOOP_FUSION, KernelKind.INPUT_FUSION) for c in consumers):
        continue  # several readers of which some cannot index in place
      reader = consumers[0]
      anchor = _anchor(ctx, reader)
      if anchor and "concatenate" not in cut:
        continue  # a slice read by a matmul: an unfused prologue
      what = "concatenate" if "concatenate" in cut else (
          "dynamic-slice" if "dynamic-slice" in cut else "slice")
      library = reader.kind in (KernelKind.CPU_LIBRARY_FUSION, KernelKind.LIBRARY_CALL,
                                KernelKind.CUSTOM_FUSION, KernelKind.TRITON_GEMM)
      out.append(FusionDecisionRecord(
          kind=FindingKind.MATERIALIZED_SLICE, producer=k.name,
          consumers=tuple(c.name for c in consumers), boundary=buf.name,
          boundary_shape=buf.shape,
          bytes_saved=_times(2 * buf.bytes, _trip(k)),
          launches_removed=_times(1, _trip(k)),
          extra_arithmetic=("offset arithmetic in the reader's loads" if what != "concatenate"
                            else "a select between the parts in the reader's loads"),
          extra_resources="none expected", numerical_class=NumericalClass.EXACT,
          guard=("no kernel yet: no kernel reads the parts in place"
                 if anchor else "none needed: the reader indexes the parts"),
          layout_effect="none: the reader reads the source buffer(s)",
          evidence=(f"{_kernel_desc(k)} writes a {what} {buf.shape} that only "
                    + ", ".join(_kernel_desc(c) for c in consumers)
                    + (" read" if len(consumers) > 1 else " reads")
                    + (f" ({anchor})" if anchor else "")
                    + (f", {k.trip_count} times per run" if (k.trip_count or 1) > 1 else "")),
          verdict=Verdict.RISKY if library else Verdict.SAFE,
          reasons=((f"the reader is a library {anchor or 'call'} that takes a "
                    "contiguous operand: reading in place needs a kernel that "
                    "takes an offset",) if library else
                   ("same-index elements at an offset: the reader can load them "
                    "in place",)),
          risks=("memory coalescing: strided reads of a column slice",) + _COMMON_RISKS,
          ops=(what,), kernel=None, trip_count=_trip(k), source=buf.source,
          computation=k.computation,
          need=(KernelNeed(FindingKind.MATERIALIZED_SLICE, anchor, (what,),
                           reads_parts=True) if anchor else None)))
  return out


# --------------------------------------------- class 8: loop-invariant work ----


def _loop_invariant(ctx: _Context) -> list[FusionDecisionRecord]:
  """Kernels in a while body whose inputs are the same on every iteration:
  carry elements the body passes through unchanged, constants, and other
  such kernels' results. Hoisting them runs them once instead of per trip."""
  out = []
  for body_name, loop in ctx.loop_of.items():
    if body_name not in ctx.comps:
      continue
    body = ctx.comps[body_name]
    if not body.parameters:
      continue
    param = body.parameters[0].name
    root = body.root
    passed: set[int] = set()
    if root.opcode == "tuple":
      for i, name in enumerate(root.operands):
        src = _through_bitcasts(body, name)
        if src is not None and src.opcode == "get-tuple-element" and \
            src.operands == (param,) and src.tuple_index == i:
          passed.add(i)
    invariant: set[str] = set()
    for i in body.instructions:
      if i.opcode == "get-tuple-element" and i.operands == (param,):
        if i.tuple_index in passed:
          invariant.add(i.name)
      elif i.opcode == "constant" or (
          i.operands and i.opcode not in ("parameter", "rng", "rng-bit-generator",
                                          "custom-call", "infeed", "outfeed",
                                          "send", "recv", "while", "conditional",
                                          "call", "tuple")
          and not i.opcode.endswith(("-start", "-done"))
          and all(o in invariant for o in i.operands)):
        invariant.add(i.name)
    for name in (i.name for i in body.instructions):
      k = ctx.kernels.get(name)
      if k is None or name not in invariant or k.kind is KernelKind.PALLAS:
        continue
      inst = ctx.inst(k)
      if inst.opcode in ("broadcast", "iota") or not any(
          ctx.comps[body_name].instruction(o).opcode != "constant" for o in inst.operands):
        continue  # constants materialized per trip: a memset, left to XLA
      trip = k.trip_count
      if trip is not None and trip <= 1:
        continue
      repeats = (trip - 1) if trip is not None else 1
      moved = k.bytes_read + k.bytes_written
      shape = inst.shape.dtype_str if inst.shape is not None else ""
      out.append(FusionDecisionRecord(
          kind=FindingKind.LOOP_INVARIANT, producer=k.name,
          consumers=tuple(c for b in ctx.writes.get(k.name, ()) for c in b.consumers),
          boundary=k.name, boundary_shape=shape,
          bytes_saved=moved * repeats, launches_removed=repeats,
          extra_arithmetic="none: computed once before the loop",
          extra_resources=f"the result ({shape}) stays live across the loop",
          numerical_class=NumericalClass.EXACT,
          guard="n/a: a change to the program (hoist), not a kernel",
          layout_effect="none",
          evidence=(f"{_kernel_desc(k)} in the body of while loop {loop} reads only "
                    f"values that do not change across iterations, and runs "
                    f"{trip if trip is not None else 'an unknown number of'} times "
                    f"moving {moved} bytes each time"),
          verdict=Verdict.SAFE,
          reasons=("hoist: compute it once before the loop (outside the scanned "
                   "function, or saved by the remat policy) and pass it in",),
          risks=("peak: the hoisted result is live for the whole loop",
                 "under jax.checkpoint/remat the recompute may be deliberate: "
                 "check the policy"),
          ops=("hoist",), kernel=None, trip_count=trip, source=k.source,
          computation=k.computation))
  return out


# ------------------------------------------------ merge: one verdict a buffer ----

#: Which class speaks for a boundary several detectors saw, strongest first.
_STRENGTH = (FindingKind.UNFUSED_EPILOGUE, FindingKind.LAYOUT_CONFLICT,
             FindingKind.UNFUSED_PROLOGUE, FindingKind.MATERIALIZED_SLICE,
             FindingKind.STANDALONE_COPY, FindingKind.EXPANDED_BROADCAST,
             FindingKind.SEPARATE_REDUCTION, FindingKind.LOOP_INVARIANT,
             FindingKind.KEEP_REUSE)
_VERDICT_RANK = {Verdict.SAFE: 0, Verdict.RISKY: 1, Verdict.KEEP: 2}


def _merge(found: list[FusionDecisionRecord]) -> list[FusionDecisionRecord]:
  """One record a boundary: the strongest actionable class speaks, the
  others become its notes; so no buffer is counted twice in a total."""
  groups: dict[tuple[str, str], list[FusionDecisionRecord]] = {}
  out = []
  for r in found:
    if not r.boundary or r.kind is FindingKind.ALREADY_FUSED:
      out.append(r)
    else:
      groups.setdefault((r.computation, r.boundary), []).append(r)
  for records in groups.values():
    records.sort(key=lambda r: (_VERDICT_RANK[r.verdict],
                                _STRENGTH.index(r.kind) if r.kind in _STRENGTH else 99,
                                r.kernel is None, -r.bytes_saved))
    head, rest = records[0], records[1:]
    if rest:
      notes = tuple(f"also {r.kind.value} ({r.verdict.value}): {r.evidence}" for r in rest)
      head = dataclasses.replace(head, notes=head.notes + notes)
    out.append(head)
  return out


# ------------------------------------------------ class 9: keep reuse ----


def _keep_reuse(ctx: _Context) -> list[FusionDecisionRecord]:
  out = []
  threshold = ctx.options.keep_fraction * ctx.peak_bytes
  for buf in ctx.buffers.values():
    if buf.internal or not buf.producer or buf.bytes < threshold:
      continue
    if buf.lifetime in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT):
      continue
    if len(buf.consumers) < ctx.options.keep_min_consumers:
      continue
    if buf.aliases and buf.lifetime is not Lifetime.INPUT:
      # Written in place (scatter, dynamic-update-slice): its readers read
      # the updated values, not what the producer wrote.
      continue
    k = ctx.kernels.get(buf.producer)
    if k is None:
      continue
    out.append(FusionDecisionRecord(
        kind=FindingKind.KEEP_REUSE, producer=k.name, consumers=buf.consumers,
        boundary=buf.name, boundary_shape=buf.shape, bytes_saved=0,
        launches_removed=0,
        extra_arithmetic=(f"fusing would recompute {k.name} in "
                          f"{len(buf.consumers)} consumers"),
        extra_resources="n/a", numerical_class=NumericalClass.EXACT, guard="n/a",
        layout_effect="none",
        evidence=(f"{buf.shape} written by {_kernel_desc(k)} is read by "
                  f"{len(buf.consumers)} kernels: {', '.join(buf.consumers)}"),
        verdict=Verdict.KEEP,
        reasons=("reuse exists: several consumers exploit the materialization",),
        risks=("cache reuse: fusing the producer duplicates its loads and work",),
        ops=(f"{len(buf.consumers)} readers",), kernel=None, trip_count=_trip(k),
        source=buf.source, computation=k.computation))
  return out
