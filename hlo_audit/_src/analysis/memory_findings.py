"""Findings that lower the peak: arguments not donated, and remat choices.

Each finding carries `peak_after`/`peak_saved` from a what-if replay of the
change it proposes (replay.py), so that the report ranks them by what they
take off the peak.

- Undonated argument: an entry parameter not in `input_output_alias` whose
  last read comes no later than the write of the output JAX's donation would
  alias it to (first output of its shape and dtype, in order), in an
  argument the step returns: more than half of the argument's leaves find
  an output. Donating it lets that output reuse the argument's memory; the
  fix names the argument numbers (`donate_argnums`) or names
  (`donate_argnames`).
- Remat candidate: a buffer live at the peak, written by an elementwise kernel
  whose inputs stay live until its late (backward) uses anyway, so
  recomputing it there costs reads and flops but no extra memory: the
  `jax.checkpoint` policy that saves only the dots (`dots_saveable`) does it.
- Costly remat: a kernel the backward pass recomputes (JAX names rematerialized
  work `rematted_computation`, or a `checkpoint` scope in `op_name`) containing dots,
  whose recompute flops are a large share of the step's while the bytes it
  keeps off the peak are small.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hlo_audit._src.analysis.buffers import Lifetime
from hlo_audit._src.analysis.donation import donation_aliases
from hlo_audit._src.analysis.program import (Argument, Program, WhatIfError,
                                             parameter_paths)
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)
from hlo_audit._src.analysis.replay import remat_split, replay, take_full_replay
from hlo_audit._src.analysis.source import attribute
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction

#: Ops a recompute may contain and still be "cheap" (no dots, no reductions).
_CHEAP_OPS = opcodes.ELEMENTWISE | frozenset({
    "parameter", "constant", "broadcast", "bitcast", "reshape", "convert",
    "iota", "tuple", "get-tuple-element", "copy", "transpose", "slice"})
#: A remat is costly when its recomputed dots are at least this share of the
#: step's dot flops.
COSTLY_REMAT_FLOP_SHARE = 0.25
#: Remat candidates replayed, the largest first.
MAX_REMAT_CANDIDATES = 8
#: op_name markers JAX leaves on rematerialized work.
_REMAT_MARKERS = ("rematted_computation", "checkpoint", "remat")


def _under_remat(op_name: str) -> bool:
  """Whether an op_name's scopes (after the `jit(f)` one) include a remat:
  a scope named by a marker, alone or with its parameters (`remat[...]`).
  Not a substring test: a function named `checkpointed` marks nothing."""
  if not any(marker in op_name for marker in _REMAT_MARKERS):
    return False  # (a scope named by one holds it: most kernels are quickly done)
  for scope in op_name.split("/")[1:]:
    head = scope.split("[", 1)[0].split("(", 1)[0]
    if head in _REMAT_MARKERS:
      return True
  return False


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Donation and remat findings with their replayed peaks."""
  return (*_undonated(program), *_remat_candidates(program), *_costly_remats(program))


# ------------------------------------------------------------- donation ----


def _function_name(module: HloModule) -> str:
  name = module.name
  for prefix in ("jit_", "pjit_"):
    if name.startswith(prefix):
      return name[len(prefix):]
  return name or "f"


def _argument_key(a: Argument) -> tuple:
  """The argument a parameter belongs to, as a donation finding names it: its
  number where the capture knows the signature, else its path's first name."""
  if a.argnum is not None:
    return ("argnum", a.argnum, a.argname)
  return ("path", re.split(r"[\[.]", a.path, maxsplit=1)[0], None)


def _returned_arguments(args: Iterable[Argument], returned: set[int]) -> set[tuple]:
  """The arguments the step returns: more than half of whose leaves
  (`returned`: aliased, or given an output of their shape and dtype by
  JAX's donation) find an output.

  State threaded through a step comes back leaf for leaf. An argument most
  of whose leaves find no output is read and kept (a model's constants, a
  batch): the caller passes it again, and a leaf that shares a shape and
  dtype with an output (a constant f32[] and the loss) matches by accident,
  so donating it would delete part of what the caller still needs. "Most",
  not "all": a wrapper may pass the batch in the same argument as the model
  and its optimizer state (equinox's `filter_jit` passes them as one `d`).
  """
  leaves: dict[tuple, list[int]] = {}
  for a in args:
    leaves.setdefault(_argument_key(a), []).append(a.parameter)
  return {key for key, numbers in leaves.items()
          if 2 * sum(n in returned for n in numbers) > len(numbers)}


def _undonated(program: Program) -> list[FusionDecisionRecord]:
  module, dataflow, schedule = program.module, program.dataflow, program.schedule
  entry = module.entry
  donated = {a.parameter for a in module.input_output_alias}
  params = [p for p in entry.parameters if p.parameter_number not in donated]
  pairs = donation_aliases(module, dataflow, [p.parameter_number for p in params])
  if not pairs:
    return []
  by_number = {p.parameter_number: p for p in entry.parameters}
  root = entry.instruction(entry.root_name)
  out_value = dict(dataflow.holds.get(root.name, ()))
  time = schedule.time
  args = {a.parameter: a for a in program.arguments}
  threaded = _returned_arguments(program.arguments, donated | {n for _, n in pairs})
  groups: dict[tuple, list[tuple[int, tuple[int, ...], int, int]]] = {}
  for index, n in pairs:
    key = _argument_key(args[n])
    if key not in threaded:
      continue  # read and kept: its outputs of the same shape are no update of it
    p = by_number[n]
    vid = (p.name, ())
    last_read = max((time[u] for u, _ in dataflow.uses.get(vid, ()) if u in time),
                    default=-1)
    written = time.get(out_value[index][0], -1)
    if last_read > written:
      continue  # read after the output is written: XLA would copy
    groups.setdefault(key, []).append((n, index, last_read, written))
  if not groups:
    return []
  argnums = sorted(k[1] for k in groups if k[0] == "argnum")
  names = sorted({k[1] for k in groups if k[0] == "path"})
  fn = _function_name(module)
  fix = []
  if argnums:
    fix.append(f"donate_argnums=({', '.join(map(str, argnums))}{',' if len(argnums) == 1 else ''})")
  if names:
    fix.append(f"donate_argnames=({', '.join(repr(n) for n in names)}"
               f"{',' if len(names) == 1 else ''})")
  suggestion = f"jax.jit({fn}, {', '.join(fix)})"
  paths = parameter_paths(module)
  found = []
  for key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
    numbers = [m[0] for m in members]
    leaf_bytes = sum(by_number[n].shape.byte_size for n in numbers)
    # No quick replay for donation (it changes the buffer assignment): the
    # first full replays of the audit's budget go to it.
    what = (replay(program, donate=[paths[n] for n in numbers])
            if numbers and take_full_replay(program, donation=True) else None)
    label = (key[2] or f"argument {key[1]}") if key[0] == "argnum" else key[1]
    shapes = {by_number[n].shape.dtype_str for n in numbers}
    outputs = tuple(entry.root_name + "{" + ",".join(map(str, m[1])) + "}" for m in members)
    found.append(FusionDecisionRecord(
        kind=FindingKind.UNDONATED_ARGUMENT, producer="", consumers=outputs,
        boundary=label,
        boundary_shape=next(iter(shapes)) if len(numbers) == 1 else f"{len(numbers)} arrays",
        bytes_saved=0, launches_removed=0, extra_arithmetic="none",
        extra_resources="none", numerical_class=NumericalClass.EXACT,
        guard="a donated argument no output can reuse: JAX warns and ignores it",
        layout_effect="the caller's donated arrays are invalid after the call",
        evidence=(f"{len(numbers)} argument leaves ({leaf_bytes} B) are not in "
                  "input_output_alias; each is last read no later than the output "
                  "of its shape and dtype is written"),
        verdict=Verdict.SAFE,
        reasons=tuple(f"{paths[n]}: last read at step {lr}, output "
                      f"{{{','.join(map(str, idx))}}} written at step {w}"
                      for n, idx, lr, w in members),
        risks=("the caller must not use the donated arrays after the call",),
        ops=tuple(paths[n] for n in numbers), suggestion=suggestion,
        computation=entry.name,
        # The update that would write into the donated memory.
        source=next((attribute(module, entry.instruction(out_value[m[1]][0]))[0]
                     for m in members if out_value[m[1]][0] in entry), None),
        peak_after=what.peak_bytes if what else None,
        peak_saved=what.peak_saved if what else None, peak_exact=what is not None))
  return found


# ---------------------------------------------------------------- remat ----


def _fused_ops(module: HloModule, inst: Instruction) -> list[Instruction]:
  calls = inst.called_computations.get("calls", ())
  if inst.opcode == "fusion" and calls and calls[0] in module:
    return list(module.computation(calls[0]).instructions)
  return [inst]


def _elementwise_cost(module: HloModule, inst: Instruction) -> tuple[bool, int]:
  """(whether `inst` is only elementwise work, its flops: one per element of
  each elementwise op)."""
  ops = _fused_ops(module, inst)
  cheap = all(op.opcode in _CHEAP_OPS for op in ops)
  flops = sum(op.shape.num_elements for op in ops
              if op.opcode in opcodes.ELEMENTWISE and op.shape is not None
              and not op.shape.is_tuple)
  return cheap, flops


def _remat_candidates(program: Program) -> list[FusionDecisionRecord]:
  module, dataflow, schedule, live = (program.module, program.dataflow,
                                      program.schedule, program.liveness)
  min_peak_saved = program.options.min_bytes_saved
  at_peak = set(live.live_at_peak)
  found = []
  replays = 0
  for b in program.buffers.values():  # largest first
    if b.lifetime in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT, Lifetime.COMMUNICATION) \
        or b.internal or not b.producer:
      continue
    vid = (b.instruction, b.index)
    buf = dataflow.buffer_of.get(vid)
    if buf is None or buf not in at_peak or len(dataflow.buffers[buf]) != 1:
      continue
    producer = program.kernels.get(b.producer)
    inst = program.find_instruction(b.instruction)
    if producer is None or inst is None:
      continue
    cheap, flops = _elementwise_cost(module, inst)
    if not cheap:
      continue
    split = remat_split(dataflow, schedule, live.value_ranges, buf)
    if split is None or not split[0] < live.peak_time < split[1]:
      continue  # not held across the peak between its two groups of uses
    again = split[1]
    # Inputs must stay live until the recompute anyway (else remat moves bytes).
    inputs_live = True
    for operand in inst.operands:
      for _, v in dataflow.holds.get(operand, ()):
        ob = dataflow.buffer_of.get(v)
        if ob is not None and ob in live.ranges and live.ranges[ob][1] < again:
          inputs_live = False
    if not inputs_live:
      continue
    if replays == MAX_REMAT_CANDIDATES:
      break
    replays += 1
    try:
      # The quick replay; `exact_peaks` replays it in full within the budget.
      peak_after = replay(program, remat=[b.name], quick=True)
    except WhatIfError:
      continue
    if live.peak_bytes - peak_after < min_peak_saved:
      continue
    found.append(FusionDecisionRecord(
        kind=FindingKind.REMAT_CANDIDATE, producer=b.producer,
        consumers=b.consumers, boundary=b.name, boundary_shape=b.shape,
        bytes_saved=0, launches_removed=-1,
        extra_arithmetic=f"{flops} flops recomputed (elementwise)",
        extra_resources=f"{producer.bytes_read} B read again to recompute",
        numerical_class=NumericalClass.EXACT,
        guard="none: the recompute is the same kernel",
        layout_effect="none", evidence=(
            f"held from step {split[0]} to step {split[1]} across the peak (step "
            f"{live.peak_time}); its inputs stay live until then anyway"),
        verdict=Verdict.SAFE,
        reasons=("elementwise of values that stay live: recompute costs no memory",),
        risks=("the backward pass reads the inputs again",),
        ops=tuple(sorted({o.opcode for o in _fused_ops(module, inst)
                          if o.opcode in opcodes.ELEMENTWISE})),
        source=b.source, computation=b.computation,
        suggestion=("jax.checkpoint(f, policy=jax.checkpoint_policies.dots_saveable)"
                    " around the layer that computes it"),
        peak_after=peak_after, peak_saved=live.peak_bytes - peak_after,
        peak_exact=False))
  found.sort(key=lambda r: -(r.peak_saved or 0))
  return found


def _dot_flops(module: HloModule, comp: Computation, inst: Instruction) -> int:
  """2 * output elements * contracted size, summed over `inst`'s dots (`comp`
  defines `inst`)."""
  calls = inst.called_computations.get("calls", ())
  if inst.opcode == "fusion" and calls and calls[0] in module:
    comp = module.computation(calls[0])
    ops: Iterable[Instruction] = comp.instructions
  else:
    ops = (inst,)
  total = 0
  for op in ops:
    if op.opcode not in ("dot", "convolution") or op.shape is None:
      continue
    # A dot's operands are defined in its own computation (names are unique
    # across the module).
    lhs = (comp.instruction(op.operands[0]).shape
           if op.operands and op.operands[0] in comp else None)
    contracted = 1
    if lhs is not None and op.opcode == "dot":
      for d in op.dot_dimension_numbers.lhs_contracting:
        if d < len(lhs.dims):
          contracted *= lhs.dims[d]
    total += 2 * op.shape.num_elements * contracted
  return total


def _costly_remats(program: Program) -> list[FusionDecisionRecord]:
  module = program.module
  kernels = program.kernels.values()
  # The rematerialized kernels: forward work the backward pass runs again
  # (none in most programs: then no dot's flops are counted).
  remat = [k for k in kernels if _under_remat(k.op_name or "") and
           ("rematted_computation" in k.op_name or "transpose(" not in k.op_name)]
  if not remat:
    return []
  flops = {}
  for k in kernels:
    comp = module.computation(k.computation) if k.computation in module else None
    if comp is not None and k.name in comp:
      flops[k.name] = _dot_flops(module, comp, comp.instruction(k.name)) * (k.trip_count or 1)
  total = sum(flops.values())
  if not total:
    return []
  again = [k for k in remat if flops.get(k.name)]  # the rematerialized dots
  recomputed = sum(flops[k.name] for k in again)
  share = recomputed / total
  if not again or share < COSTLY_REMAT_FLOP_SHARE:
    return []
  kept = sum(k.bytes_written for k in again)
  first = again[0]
  return [FusionDecisionRecord(
      kind=FindingKind.COSTLY_REMAT, producer=first.name,
      # No boundary: the finding is about kernels, not a buffer.
      consumers=tuple(k.name for k in again[1:]), boundary="",
      boundary_shape=f"{len(again)} recomputed dots", bytes_saved=0,
      launches_removed=len(again),
      extra_arithmetic=(f"{recomputed} dot flops recomputed ({100 * share:.0f}% of "
                        "the step's dot flops)"),
      extra_resources=f"saving their outputs instead holds {kept} B more",
      numerical_class=NumericalClass.EXACT, guard="none", layout_effect="none",
      evidence=(f"{len(again)} dots marked rematerialized in op_name, e.g. "
                f"{first.op_name!r}"),
      verdict=Verdict.RISKY,
      reasons=(f"recomputing matmuls costs {100 * share:.0f}% of the step's dot "
               f"flops to keep {kept} B off the peak",),
      risks=("saving the dot outputs raises the peak by up to their bytes",),
      source=first.source, computation=first.computation,
      suggestion=("jax.checkpoint(f, policy=jax.checkpoint_policies.dots_saveable) "
                  "(or dots_with_no_batch_dims_saveable): save the matmuls, "
                  "recompute only the elementwise"))]
