"""Standalone copies and layout conflicts: data movement XLA runs as a kernel.

A copy, transpose or dtype conversion written to memory, by what it is for:
an aliasing copy of a donated argument, loop state (a while loop's initial
state or carry), a dtype round trip, a permutation feeding a matmul whose
dimension numbers could read the original layout (a layout conflict), one a
library requires (kept), or a plain copy its readers could index through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import Buffer, Lifetime, is_layout_conversion
from hlo_audit._src.analysis.detectors.common import (COMMON_RISKS, anchor_of,
                                                      consumer_kernels, fused_computation,
                                                      kernel_desc, operand_producers,
                                                      through_bitcasts, through_moves,
                                                      times)
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.layouts import cut_reorders, kernel_permutes, permutes
from hlo_audit._src.analysis.program import Program, buffer_name
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             KernelNeed, NumericalClass, Verdict)
from hlo_audit._src.hlo import dtypes
from hlo_audit._src.hlo.ir import Instruction


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Standalone copies, transposes and conversions, by what they are for:
  aliasing copies of donated arguments, loop-state copies, dtype round
  trips, permutations feeding a matmul (layout conflicts), permutations a
  library requires, and plain copies. Convert-only kernels feeding one
  matmul are left to the prologue detector. A kernel holding a narrowing
  round trip (f32 -> bf16 -> f32) is never removed bit-exactly."""
  out = []
  for k in program.kernels.values():
    start = len(out)
    _copies_of(program, k, out)
    if len(out) > start:
      consumers = [program.kernels[c] for c in {c for r in out[start:] for c in r.consumers}
                   if c in program.kernels]
      trip = _narrowing_round_trip(program, k, consumers)
      if trip:
        out[start:] = [r if r.numerical_class is NumericalClass.PRECISION_CHANGE
                       else _drops_rounding(r, trip) for r in out[start:]]
  return tuple(out)


def _copies_of(program: Program, k: Kernel, out: list[FusionDecisionRecord]) -> None:
  """`find`'s records for one kernel, appended to `out`."""
  if k.kind is KernelKind.PALLAS:
    return
  inst = program.inst(k)
  # A kernel that cuts a part out of its operand and reorders it (a KV
  # cache's layer sliced and transposed for the attention dot) converts
  # that part's layout: its reader could index the operand at the offset.
  cut = cut_reorders(program.module, inst)
  if not (k.kind is KernelKind.COPY or cut or is_layout_conversion(program.module, inst)):
    return
  comp = program.comps[k.computation]
  if bt.stages_memory_space(comp, inst):
    return  # XLA:TPU staging a value into VMEM or evicting it: no copy of the program's
  moves = cut or kernel_permutes(program.module, comp, inst)
  converts = "convert" in k.fused_ops or inst.opcode == "convert"
  own = program.writes.get(k.name, ())
  for buf in own or _shared_write(program, k):
    if buf.internal or buf.lifetime is Lifetime.EXTERNAL_OUTPUT and \
        bt.moves_memory_space(comp, inst):
      # The output's one write to device memory, from where XLA:TPU kept
      # the value on chip: no copy to remove (the write stays).
      continue
    consumers = consumer_kernels(program, buf)
    consumer_desc = ", ".join(c.name for c in consumers) or "the program's output"
    src_layout, dst_layout = _layouts(program, k, inst)
    rec = dict(
        producer=k.name, consumers=tuple(c.name for c in consumers),
        boundary=buf.name, boundary_shape=buf.shape,
        bytes_saved=times(2 * buf.bytes, k.trip_count),
        launches_removed=times(1, k.trip_count), extra_resources="none expected",
        numerical_class=NumericalClass.EXACT, trip_count=k.trip_count,
        source=buf.source, computation=k.computation, kernel=None,
        # Into a buffer that stays (loop state, a conditional's result): the
        # copy's traffic goes, the buffer does not.
        boundary_kept=not own)
    anchors = [c for c in consumers if anchor_of(program, c)]
    aliasing = _aliasing_copy(program, k, inst)
    # A permuting copy into loop state is a layout change first: the
    # producer could write the loop's layout directly.
    # A conversion computes new values: XLA never inserts one for the loop's
    # or the output's buffer discipline (a copy it inserts may have a
    # conversion fused into it: that kernel keeps its role).
    computes = converts and "copy" not in k.fused_ops
    role, why = ("", "") if aliasing or moves or computes else _loop_role(program, k, inst)
    back, preserving = _round_trip(program, k, consumers) if converts else ([], False)
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
          verdict=verdict, reasons=reasons, risks=COMMON_RISKS,
          ops=("convert round trip",)))
    elif moves and anchors:
      anchor = anchor_of(program, anchors[0])
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
            + COMMON_RISKS, ops=("transpose",)))
    elif not moves and converts and consumers and len(anchors) == len(consumers):
      continue  # a cast read only by matmuls: an unfused prologue
    elif not moves and converts and not consumers and _casts_matmul_alone(program, k):
      # A cast writing the program's output from a matmul's result it alone
      # reads: the output is written whatever happens; what can go is the
      # matmul's result before it, the matmul's epilogue (reported there).
      continue
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
          evidence=(f"XLA runs {kernel_desc(k)} as its own kernel: a {what}"
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
                ("cache reuse: several consumers would each redo it",) + COMMON_RISKS,
          ops=(what,)))


def _shared_write(program: Program, k: Kernel) -> tuple[Buffer, ...]:
  """The buffer a copy kernel writes when another value defined it first (a
  while body's new carry element, copied into the loop state at its end; a
  conditional branch's result): that buffer, named after the copy."""
  if program.inst(k).opcode != "copy":
    return ()
  first = program.dataflow.buffer_of.get((k.name, ()))
  buf = program.buffers.get(buffer_name(first)) if first is not None else None
  if buf is None or first == (k.name, ()):
    return ()
  return (dataclasses.replace(buf, name=k.name, instruction=k.name, index=(),
                              computation=k.computation, producer=k.name,
                              producer_opcode="copy"),)


def _casts_matmul_alone(program: Program, k: Kernel) -> bool:
  """Whether every operand of `k` holds a result a matmul (or convolution)
  wrote that `k` alone reads."""
  producers = operand_producers(program, k)
  if not producers or not all(producers):
    return False
  for names in producers:
    for name in names:
      p = program.kernels[name]
      if anchor_of(program, p) is None or any(
          [c.name for c in consumer_kernels(program, b)] != [k.name]
          for b in program.writes.get(name, ())):
        return False
  return True


def _layouts(program: Program, k: Kernel, inst: Instruction) -> tuple[str, str]:
  """(operand layout, result layout) of a copy-like kernel; for a fusion
  whose permutation happens inside (a transpose between bitcasts), the
  permuting instruction's, so the two differ where the data moves."""
  src = _layout_of(program, inst.operands[0], k.computation) if inst.operands else "{}"
  dst = str(inst.shape.layout) if inst.shape is not None and inst.shape.layout else "{}"
  fused = fused_computation(program, k)
  if src == dst and fused is not None:
    for i in fused.instructions:
      if i.opcode in ("transpose", "copy") and permutes(fused, i):
        before = _layout_of(program, i.operands[0], None) if i.operands[0] not in fused \
            else str(fused.instruction(i.operands[0]).shape.layout or "{}")
        if i.opcode == "transpose":
          return (f"{fused.instruction(i.operands[0]).shape.dtype_str}{before}",
                  f"{i.shape.dtype_str}{i.shape.layout or ''} "
                  f"(dimensions={{{','.join(map(str, i.dimensions or ()))}}})")
        return before, str(i.shape.layout or "{}")
  return src, dst


def _layout_of(program: Program, name: str, computation: str | None = None) -> str:
  if computation is not None and name in program.comps[computation]:
    shape = program.comps[computation].instruction(name).shape
    return str(shape.layout) if shape is not None and shape.layout is not None else "{}"
  for comp in program.comps.values():
    if name in comp:
      shape = comp.instruction(name).shape
      if shape is not None and shape.layout is not None:
        return str(shape.layout)
  return "{}"


def _aliasing_copy(program: Program, k: Kernel, inst: Instruction) -> str:
  """For an entry copy of a donated parameter: why XLA copies it, else ""."""
  comp = program.comps[k.computation]
  if comp.name != program.module.entry.name or inst.opcode != "copy" or not inst.operands:
    return ""
  src = through_bitcasts(comp, inst.operands[0])
  if src is None or src.opcode != "parameter":
    return ""
  outputs = [a.output_index for a in program.module.input_output_alias
             if a.parameter == src.parameter_number]
  if not outputs:
    return ""
  readers = [u.name for u in program.users(comp, inst.name)]
  out = ",".join(map(str, outputs[0]))
  return (f"argument {src.parameter_number} ({src.name}) is donated and aliased to "
          f"output {{{out}}}, but its old value is still read after the kernel "
          f"writing that output runs, so XLA copies it first (read by "
          f"{', '.join(readers[:4])}{'...' if len(readers) > 4 else ''})")


def _loop_role(program: Program, k: Kernel, inst: Instruction) -> tuple[str, str]:
  """(role, explanation) of a copy on a while loop's boundary, else ("", "")."""
  comp = program.comps[k.computation]
  users = program.users(comp, k.name)
  feeds_while = [u for u in users if u.opcode == "while"] + [
      w for u in users if u.opcode == "tuple"
      for w in program.users(comp, u.name) if w.opcode == "while"]
  if feeds_while:
    src = through_bitcasts(comp, inst.operands[0]) if inst.operands else None
    siblings = [u for u in program.users(comp, src.name) if u.opcode == "copy"] \
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
  # Returned as it is: the root itself, or an element (or view) of it; a
  # root that computes from the copy is a reader like any other.
  if comp.name == program.module.entry.name and any(
      u.name == comp.root_name and u.opcode in ("tuple", "bitcast") for u in users
  ) or k.name == comp.root_name:
    src = through_bitcasts(comp, inst.operands[0]) if inst.operands else None
    if src is not None and src.opcode == "parameter":
      return "output copy (argument)", (
          f"the program returns entry argument {src.name} (or a view of it); an "
          "argument that is not donated cannot be the output buffer, so XLA "
          "copies it. Donating it (donate_argnums) or not returning it removes "
          "the copy")
    return "output copy", (
        "each output needs a buffer of its own: a value returned more than once, "
        "or a constant, is copied into each output")
  loop = program.loop_of.get(comp.name)
  if loop is None:
    return "", ""
  param = comp.parameters[0].name if comp.parameters else ""
  src = through_bitcasts(comp, inst.operands[0]) if inst.operands else None
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


def _round_trip(program: Program, k: Kernel, consumers: list[Kernel]) -> tuple[list[Kernel], bool]:
  """Consumers converting `k`'s result back to its source dtype, and whether
  the round trip preserves values (widening first, e.g. bf16 -> f32 -> bf16)."""
  back = [c for c in consumers if _converts_back(program, k, c)]
  if not back or len(back) != len(consumers):
    # Another reader uses the converted value itself: not a round trip to
    # remove (e.g. x cast to bf16 for a dot, and back to f32 for another).
    return [], False
  a = program.inst(k)
  src = program.comps[k.computation].instruction(a.operands[0]).shape
  widening = dtypes.is_widening(src.element_type, a.shape.element_type)
  return back, widening


def _converts_back(program: Program, first: Kernel, second: Kernel) -> bool:
  """`first` converts dtype a -> b and `second` converts its result back to a."""
  a, b = program.inst(first), program.inst(second)
  if not (is_layout_conversion(program.module, a) and is_layout_conversion(program.module, b)):
    return False
  if not a.operands or a.shape is None or b.shape is None or not a.shape.is_array:
    return False
  src = program.comps[first.computation].instruction(a.operands[0]).shape
  return (src is not None and src.is_array and
          src.element_type == b.shape.element_type != a.shape.element_type and
          src.dims == b.shape.dims)


def _narrowing_round_trip(program: Program, k: Kernel, consumers: Sequence[Kernel]) -> str:
  """"f32 -> bf16 -> f32" when removing `k` drops a rounding the program
  asked for: `k` narrows a value and widens it back itself, or narrows it
  and a reader widens it on load; "" otherwise."""
  fused = fused_computation(program, k)
  comp = fused if fused is not None else program.comps[k.computation]
  insts = fused.instructions if fused is not None else (program.inst(k),)
  narrowed = None
  for i in insts:
    if i.opcode != "convert" or not i.operands or i.shape is None:
      continue
    src = through_moves(comp, i.operands[0])
    a = src.shape.element_type if src is not None and src.shape is not None else None
    if _widened_from(comp, src, i.shape.element_type):
      continue  # back to the type the values came in: nothing is rounded
    if src is not None and src.opcode == "convert" and src.operands:
      first = through_moves(comp, src.operands[0])
      if first is not None and first.shape is not None:
        t0, t1, t2 = first.shape.element_type, a, i.shape.element_type
        if t0 == t2 != t1 and not dtypes.is_widening(t0, t1) and \
            not _widened_from(comp, first, t1):
          return f"{t0} -> {t1} -> {t2}"
    if a is not None and a != i.shape.element_type and \
        not dtypes.is_widening(a, i.shape.element_type):
      narrowed = (a, i.shape.element_type)
  if narrowed is None:
    return ""
  for c in consumers:
    cf = fused_computation(program, c)
    if cf is not None and any(
        i.opcode == "convert" and i.shape is not None and
        i.shape.element_type == narrowed[0] and i.operands and
        (src := through_moves(cf, i.operands[0])) is not None and
        src.opcode == "parameter" and src.shape is not None and
        src.shape.element_type == narrowed[1] for i in cf.instructions):
      return f"{narrowed[0]} -> {narrowed[1]} -> {narrowed[0]}"
  return ""


def _widened_from(comp, inst: Instruction | None, t: str) -> bool:
  """Whether `inst` holds values widened from `t` (through moves and static
  slices: XLA:CPU widening a bf16 cache before cutting a layer out of it),
  so that rounding them back to `t` rounds nothing."""
  while inst is not None and inst.opcode in ("bitcast", "reshape", "copy", "transpose",
                                             "slice") and inst.operands:
    inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  if inst is None or inst.opcode != "convert" or not inst.operands or \
      inst.operands[0] not in comp:
    return False
  src = comp.instruction(inst.operands[0]).shape
  return (src is not None and src.is_array and src.element_type == t and
          inst.shape is not None and dtypes.is_widening(t, inst.shape.element_type))


def _drops_rounding(r: FusionDecisionRecord, trip: str) -> FusionDecisionRecord:
  """`r` for a fix that removes a narrowing round trip: never bit-exact,
  never safe."""
  return dataclasses.replace(
      r, numerical_class=NumericalClass.PRECISION_CHANGE,
      verdict=Verdict.RISKY if r.verdict is Verdict.SAFE else r.verdict,
      reasons=r.reasons + (f"the kernel rounds {trip}: removing it removes "
                           "the rounding, and the results change",),
      evidence=r.evidence + f"; it holds a narrowing round trip ({trip})")
