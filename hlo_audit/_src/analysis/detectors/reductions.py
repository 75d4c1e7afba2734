"""Separate reductions: a reduction kernel re-reading a buffer its producer wrote.

One record per buffer, naming every reduction that reads it, with what the
reduction computes (a layer or RMS norm's statistics, a softmax, batch or
group statistics, a contraction XLA runs as multiply + reduce, a column
reduction) and over which axes; a gemm -> softmax -> gemm chain is an
attention kernel's business, and x_hat saved for one backward reduction can
be recomputed there. Reductions split in two kernels (tree stages), a gemm's
own split-K sums and reductions that need values computed later are not
separate reductions. Rows a kernel writes beside their softmax statistic
(XLA:TPU's multi-output fusions), every reader of which needs the statistic
first, are one too, though no reader reduces them again.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from hlo_audit._src.analysis import anchors
from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import Buffer, Lifetime, fused_root
from hlo_audit._src.analysis.dataflow import ValueId
from hlo_audit._src.analysis.detectors.common import (COMMON_RISKS, anchor_of,
                                                      consumer_kernels, fused_computation,
                                                      kernel_desc, one_per_row,
                                                      operand_number, operand_producers,
                                                      primitives,
                                                      product, split_k_site,
                                                      through_bitcasts, through_kernels,
                                                      through_moves, times)
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             KernelNeed, NumericalClass, Statistics,
                                             Verdict, with_changes)
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, Instruction


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Buffers a separate reduction kernel re-reads: one record per buffer,
  naming every reduction that reads it."""
  # vid -> its reductions by name (names are unique: equal kernels are one
  # kernel, and comparing names avoids the dataclass's field-by-field __eq__).
  readers: dict[ValueId, dict[str, Kernel]] = {}
  # Values read as a gemm's split-K partial sums (each reader sums them).
  partials: set[ValueId] = set()
  holds = program.dataflow.holds
  for r in program.kernels.values():
    if not _is_reduction_kernel(program, r):
      continue
    fed = _fed_operands(program, r)
    split_k = None  # (partial sums need a split-K reduce to sum them)
    for n, operand in enumerate(program.inst(r).operands):
      if fed is not None and not fed >> n & 1:
        continue  # read beside the reduction, or a gemm's partial sums summed alone
      held = holds.get(operand, ())
      if not held:
        continue
      if split_k is None:
        split_k = split_k_site(program, r) is not None
      sums = split_k and _sums_partials(program, r, n)
      for _, vid in held:
        readers.setdefault(vid, {}).setdefault(r.name, r)
        if sums:
          partials.add(vid)
  out = []
  # A norm backward's reduction kernels -> the anchor its need names.
  norm_kernels: dict[str, str] = {}
  # Images the program normalizes per sample in groups: (batch, elements).
  group_normed: set[tuple[int, int]] = set()
  for vid, by_name in readers.items():
    reductions = list(by_name.values())
    bid = program.dataflow.buffer_of.get(vid)
    if bid is None:
      continue
    buf = program.buffers.get(bid[0] + ("{" + ",".join(map(str, bid[1])) + "}" if bid[1] else ""))
    if buf is None or not buf.producer or buf.internal or buf.lifetime is Lifetime.INPUT:
      continue
    if vid in partials and len(buf.consumers) == 1:
      continue  # the one kernel finishing a split-K gemm reduces its result too
    # The kernel that wrote the value read: for a buffer updated in place
    # (a scatter-add into zeros) that is the last writer, not the first.
    producer = program.kernels.get(vid[0]) or program.kernels.get(buf.producer)
    if producer is None or producer.name in by_name:
      continue
    if _fills_constant(program, producer, vid[1]):
      continue  # one constant everywhere: no data the producer could reduce
    if _scatters_into_constant(program, producer, vid[1]):
      # A scatter into a table of one constant (a scatter-add into zeros:
      # an embedding's gradient, a segment sum): each value is complete only
      # once every update landing on it has, and no earlier kernel holds it.
      continue
    # A reduction inside a loop of which the producer is not part reads the
    # buffer on every trip (loop state the body updates, initialised by the
    # producer's copy): the producer, run once, cannot compute it.
    reductions = [r for r in reductions if r.trip_count == producer.trip_count]
    if not reductions:
      continue
    if all(_tree_stage(program, producer, buf, r) for r in reductions):
      continue  # XLA's reduction split in two kernels: one reduction
    others = [c for c in buf.consumers if c not in by_name and c != producer.name]
    if "transpose(" not in producer.op_name and all(
        "transpose(" in r.op_name for r in reductions):
      # Saved for backward: a backward reduction (dgamma = sum(dy * x_hat))
      # needs values the forward producer does not have yet; what can go is
      # the saved buffer itself, when the reduction can recompute it.
      saved = _saved_normalized(program, buf, producer, reductions, others)
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
              _needs_later_values(program, r, buf, producer, ready)}
      if not more:
        break
      later |= more
    if later:
      reductions = [r for r in reductions if r.name not in later]
      others = [c for c in buf.consumers if c not in by_name or c in later]
      others = [c for c in others if c != producer.name]
      if not reductions:
        continue
    whole = [r for r in reductions if _whole_normalization(program, r, buf, vid in partials)]
    # XLA's one-kernel norms each summing a gemm's split-K partial sums again:
    # no norm kernel is missing, the partial sums are what each re-reads.
    norms_of_partials = vid in partials and len(whole) == len(reductions)
    if len(whole) == len(reductions) and not norms_of_partials:
      # XLA's own Triton softmax or norm: already one kernel. Only a fused
      # attention kernel removes the boundary, where a gemm feeds it and a
      # gemm reads it.
      chain = _attention_chain(program, buf, producer, reductions)
      if chain is not None:
        out.append(chain)
      continue
    if whole and not norms_of_partials:
      # read beside the others, as any reader (a norm's backward in one kernel)
      reductions = [r for r in reductions if r not in whole]
      others = others + [r.name for r in whole]
    only = not others and len(reductions) == 1
    stats = None
    pattern = None
    reducer = None
    for r in reductions:
      stats = stats or _statistics(program, r, buf)
      reducer = reducer or _reducer_of(program, r, buf)
      pattern = pattern or _reduction_pattern(program, r, producer, stats, buf, reducer)
    if pattern == "group_norm_stats" and stats is not None and _in_groups(stats):
      group_normed.add(_per_sample(stats.dims))
    if pattern == "contraction" and stats is not None:
      stats = dataclasses.replace(stats, affine=None)  # a weight, not a norm's scale
    # A pattern some kernel could compute asks the libraries; a norm's
    # backward pass is its forward kernel's business.
    need = (KernelNeed(FindingKind.SEPARATE_REDUCTION, pattern, statistics=stats)
            if pattern in _KERNEL_PATTERNS and not norms_of_partials else None)
    # (Rows as the reduction reads them: a split-K gemm's partial sums have
    # one more axis.)
    norm = (_norm_of_backward(program, [producer, *reductions],
                              stats.dims if stats is not None else buf.dims)
            if pattern == "norm_backward" and not norms_of_partials else None)
    if norm is not None:
      # The norm's own kernel, called in the forward, runs its backward as
      # one pass over dy (dx, and gamma/beta gradients as partial sums).
      need = KernelNeed(FindingKind.SEPARATE_REDUCTION, norm + BACKWARD)
      norm_kernels.update((r.name, need.anchor) for r in reductions)
    gemm = _column_sum_gemm(program, others, stats) if pattern == "column_reduction" else None
    if gemm is not None:
      # dW = x^T @ dy reads dy whole: its kernel can sum dy's columns as it
      # streams them (cuBLASLt's bias-gradient epilogue), the reduction's
      # re-read gone.
      need = KernelNeed(FindingKind.SEPARATE_REDUCTION, "dot", ("column_sum",),
                        statistics=stats, anchor_kernel=gemm)
    conv = (_column_sum_conv(program, buf, others, stats)
            if pattern == "column_reduction" and gemm is None else None)
    if conv is not None:
      # The convolution's weight gradient streams dy whole: the same
      # bias-gradient epilogue, per output channel.
      need = KernelNeed(FindingKind.SEPARATE_REDUCTION, "convolution", ("column_sum",),
                        statistics=stats, anchor_kernel=conv)
    if pattern == "batch_norm_stats" and anchor_of(program, producer) == "convolution":
      # Per-channel sums of the convolution's own output: its kernel can
      # add each tile's into partial sums as it writes the tile.
      need = KernelNeed(FindingKind.SEPARATE_REDUCTION, "convolution",
                        ("batch_norm_stats",), statistics=stats)
    trip = producer.trip_count
    saved = 2 * buf.bytes if only else buf.bytes * len(reductions)
    what = _reduction_text(pattern, stats, buf, any(
        "transpose(" in k.op_name for k in (producer, *reductions)) or
        "transpose(" in _output_op_name(program, producer, buf), reducer)
    out.append(FusionDecisionRecord(
        kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
        consumers=tuple(r.name for r in reductions) + tuple(others),
        boundary=buf.name, boundary_shape=buf.shape,
        bytes_saved=times(saved, trip),
        launches_removed=times(1 if only else 0, trip),
        extra_arithmetic="per-tile partial reductions in the producer, and a "
                         "small final combine",
        extra_resources="one partial-accumulator row per tile",
        numerical_class=NumericalClass.REASSOCIATED,
        guard="keep XLA's reduction when tiles cannot span the axis",
        layout_effect="none",
        evidence=(f"{', '.join(kernel_desc(r) for r in reductions)} re-read"
                  f"{'s' if len(reductions) == 1 else ''} {buf.shape} written by "
                  f"{kernel_desc(producer)}" +
                  (f"; {len(others)} other kernel(s) read it too" if others else
                   "; no other kernel reads it") +
                  ("; it holds the gemm's split-K partial sums, which each reader sums "
                   "again" if vid in partials else "") +
                  ("; each reader is XLA's one-kernel norm (statistics and apply): no "
                   "norm kernel is missing, the gemm's split-K sum finished once "
                   "removes the re-reads" if norms_of_partials else "") +
                  (f"; {what}" if what else "")),
        verdict=Verdict.SAFE if only else Verdict.RISKY,
        reasons=(("tile-local partial reductions",) if only else
                 ("tile-local partial reductions",
                  "other readers keep the buffer: only the re-reads go")),
        risks=("numerical: reassociated sums change the last bits",
               "shared/local memory for partials may lower occupancy") + COMMON_RISKS,
        ops=(pattern or "reduce",), trip_count=trip,
        source=buf.source, computation=producer.computation, need=need,
        boundary_kept=bool(others)))
  reported = {f.boundary for f in out}
  out += [f for f in _statistics_beside(program) if f.boundary not in reported]
  return tuple(_norm_parameter_gradients(program, out, norm_kernels, group_normed))


def _in_groups(stats: Statistics) -> bool:
  """Whether per-sample statistics keep an axis of channel groups and reduce
  the channels within each ([N, HW, G, C/G] over HW and C/G), as a group
  norm's do; an instance norm's keep every channel."""
  kept = [i for i in range(1, len(stats.dims)) if i not in stats.axes]
  return any(j > i for i in kept for j in stats.axes)


def _per_sample(dims: Sequence[int]) -> tuple[int, int]:
  """(batch, elements) of a reduced operand: a group norm's statistics read
  x as [N, H, W, G, C/G] and its gradients' column sums as [N, H, W, C],
  one count either way."""
  return int(dims[0]), math.prod(int(d) for d in dims)


#: Suffix of the anchor a norm's backward pass needs ("layer_norm_backward").
BACKWARD = "_backward"


def _times_normalized(program: Program, k: Kernel) -> str | None:
  """The norm ("layer_norm", "rms_norm") whose normalized values x_hat
  kernel `k` multiplies elementwise by another value (dy * x_hat, gamma's
  gradient before its column sum), x_hat read whole from a forward kernel
  that takes an rsqrt of one statistic per row; None."""
  fused = fused_computation(program, k)
  if fused is None:
    return None
  producers = operand_producers(program, k)
  for inst in fused.instructions:
    if inst.opcode != "multiply" or inst.shape is None:
      continue
    for name in inst.operands:
      src = through_bitcasts(fused, name)
      if src is None or src.opcode != "parameter" or src.shape is None or \
          product(src.shape.dims) != product(inst.shape.dims) or \
          src.parameter_number >= len(producers):
        continue
      for p in producers[src.parameter_number]:
        norm = program.kernels[p]
        if "transpose(" not in norm.op_name:
          found = _norm_in(program, norm, src.shape.dims)
          if found:
            return found
  return None


def _norm_in(program: Program, k: Kernel, dims: Sequence[int]) -> str | None:
  """The norm kernel `k` normalizes the rows of `dims` with, where it takes
  an rsqrt of one statistic per row (a batch norm's is one per channel):
  "layer_norm" where the statistic is a variance (`_centered`), else
  "rms_norm"; None without such an rsqrt."""
  fused = fused_computation(program, k)
  if fused is not None:
    comp, insts = fused, fused.instructions
    caller, outer = program.inst(k), program.comps[k.computation]
  else:
    comp, insts, caller, outer = program.comps[k.computation], (program.inst(k),), None, None
  if not dims:
    return None
  rows = product(dims) // max(dims[-1], 1)
  for i in insts:
    if i.opcode == "rsqrt" and i.shape is not None and product(i.shape.dims) == rows:
      return "layer_norm" if _centered(program, comp, i, caller, outer, rows) else "rms_norm"
  return None


def _centered(program: Program, comp: Computation, rsqrt: Instruction,
              caller: Instruction | None, outer: Computation | None, rows: int) -> bool:
  """Whether the per-row statistic `rsqrt` takes is a variance: a
  subtraction leads to it (E[x^2] - E[x]^2 on the row values, or x - mean
  in the values a row reduction sums), where an RMS norm's mean of squares
  has none. Walked back across kernels through per-row values, and through
  the elementwise work on the full rows each reduction sums."""
  # (computation, name, its fusion instruction and that one's computation,
  # whether the value is a full row a reduction sums)
  stack = [(comp, o, caller, outer, False) for o in rsqrt.operands]
  seen: set[tuple[str, str, bool]] = set()
  while stack and len(seen) < 512:
    comp, name, caller, outer, full = stack.pop()
    if (comp.name, name, full) in seen or name not in comp:
      continue
    seen.add((comp.name, name, full))
    inst = comp.instruction(name)
    op = inst.opcode
    if op == "parameter":
      n = inst.parameter_number or 0
      if caller is not None and outer is not None and n < len(caller.operands):
        stack.append((outer, caller.operands[n], None, None, full))
      continue
    if op in ("fusion", "get-tuple-element"):
      fusion = inst if op == "fusion" else (
          comp.instruction(inst.operands[0]) if inst.operands and inst.operands[0] in comp
          else None)
      calls = fusion.called_computations.get("calls", ()) if fusion is not None and \
          fusion.opcode == "fusion" else ()
      if calls and calls[0] in program.module:
        called = program.module.computation(calls[0])
        root = called.root
        if op == "fusion":
          stack.append((called, root.name, fusion, comp, full))
        elif root.opcode == "tuple" and (inst.tuple_index or 0) < len(root.operands):
          stack.append((called, root.operands[inst.tuple_index or 0], fusion, comp, full))
      continue
    if op == "subtract":
      return True
    if op == "reduce":
      if not full and inst.operands:
        stack.append((comp, inst.operands[0], caller, outer, True))
      continue
    size = product(inst.shape.dims) if inst.shape is not None and inst.shape.is_array else 1
    if full:
      if op not in opcodes.ELEMENTWISE and op not in (
          "bitcast", "reshape", "broadcast", "copy", "convert"):
        continue
    elif size not in (rows, 1):
      continue  # a full-size value outside a reduction's input: not the statistic
    stack.extend((comp, o, caller, outer, full) for o in inst.operands)
  return False


def _norm_of_backward(program: Program, kernels: Sequence[Kernel],
                      dims: Sequence[int]) -> str | None:
  """The norm a backward pass over rows of `dims` belongs to: the one whose
  per-row rsqrt a kernel of it takes, or reads from the forward kernel that
  took it (the saved rstd, x_hat); None where none does."""
  for k in kernels:
    found = _norm_in(program, k, dims)
    for names in () if found else operand_producers(program, k):
      for name in names:
        found = found or _norm_in(program, program.kernels[name], dims)
    if found:
      return found
  return None


def _norm_parameter_gradients(program: Program, found: Sequence[FusionDecisionRecord],
                              norm_kernels: dict[str, str],
                              group_normed: set[tuple[int, int]]
                              ) -> list[FusionDecisionRecord]:
  """`found` with a norm's scale and shift gradients needing that norm's
  kernel, whose backward sums them beside dx: column reductions of what a
  norm backward's reduction kernels wrote (`norm_kernels`), or of dy * x_hat
  and dy where a kernel of the reduction forms dy * x_hat; and, over the
  leading axes of an image the program normalizes per sample in groups
  (`group_normed`, from its group-norm statistics), a group norm's (which
  sums its gamma and beta gradients as a batch norm would: the column sum
  alone cannot tell them apart)."""
  out = []
  for f in found:
    if f.ops != ("column_reduction",):
      out.append(f)
      continue
    anchor = norm_kernels.get(f.producer)
    # Whether the buffer summed is dy * x_hat (gamma's gradient), not dy (beta's).
    scale = True
    if anchor is None and f.need is not None and f.need.anchor == "column_reduction":
      # dy * x_hat summed over the rows, or dy beside a kernel forming it;
      # or, written only for the column sum, a backward kernel's product in
      # which x_hat is recomputed from the saved row statistics.
      producer = program.kernels.get(f.producer)
      norm = _times_normalized(program, producer) if producer is not None else None
      if norm is None:
        norm = next(filter(None, (_times_normalized(program, program.kernels[name])
                                  for name in f.consumers if name in program.kernels)), None)
        scale = norm is None
      if norm is None and producer is not None and not f.boundary_kept and \
          "transpose(" in producer.op_name and f.need.statistics is not None:
        norm = _norm_in(program, producer, f.need.statistics.dims)
      anchor = norm and norm + BACKWARD
      stats = f.need.statistics
      if anchor is None and stats is not None and len(stats.dims) >= 4 and \
          _per_sample(stats.dims) in group_normed:
        anchor = "group_norm" + BACKWARD
    if anchor is None:
      out.append(f)
      continue
    norm_name = anchor.removesuffix(BACKWARD).replace("_", " ")
    out.append(with_changes(
        f, need=KernelNeed(FindingKind.SEPARATE_REDUCTION, anchor),
        evidence=f.evidence + (
            f"; this is a {norm_name}'s {'scale (gamma)' if scale else 'shift (beta)'} "
            "gradient, which the norm's backward kernel sums beside dx")))
  return out


def _statistics_beside(program: Program) -> list[FusionDecisionRecord]:
  """Rows written beside their statistic: a kernel writing a row reduction
  (a softmax's sum, the softmax backward's rowsum(dP * P)) and, as another
  output, the rows it reduces, every reader of which reads the statistic
  too (or a row-sized value computed from it). The readers apply the
  statistic to whole rows, so the rows go to memory until it is known; no
  reader re-reduces them (XLA:TPU fuses the reduction into the producer),
  yet a kernel holding each row (a softmax, a fused attention or
  cross-entropy) would keep them on chip."""
  out = []
  for producer in program.kernels.values():
    fused = fused_computation(program, producer)
    if fused is None or fused.root_name not in fused:
      continue
    root = fused.instruction(fused.root_name)
    if root.opcode != "tuple":
      continue
    for i, name in enumerate(root.operands):
      reduce = fused.instruction(name)
      for j, rows in _rows_reduced(fused, root, reduce):
        stat = program.buffers.get(f"{producer.name}{{{i}}}")
        buf = program.buffers.get(f"{producer.name}{{{j}}}")
        if stat is None or buf is None or buf.internal or not buf.consumers:
          continue
        record = _beside_record(program, producer, buf, stat, rows,
                                reducer_op(program, reduce))
        if record is not None:
          out.append(record)
  return out


def _rows_reduced(fused: Computation, root: Instruction,
                  inst: Instruction) -> list[tuple[int, int]]:
  """For a reduce among a fusion's outputs that reduces trailing axes (one
  result per row), the other outputs it reduces, index by index: (output
  number, row length) of each."""
  if inst.opcode != "reduce" or not inst.operands or inst.operands[0] not in fused:
    return []
  operand = fused.instruction(inst.operands[0])
  axes = sorted(inst.dimensions or ())
  if operand.shape is None or not operand.shape.is_array or not axes:
    return []
  rank = len(operand.shape.dims)
  if axes != list(range(rank - len(axes), rank)) or len(axes) == rank:
    return []
  size = product(operand.shape.dims)
  outputs = {n: j for j, n in enumerate(root.operands)}
  found, seen, stack = [], set(), [operand.name]
  # The reduce's operand and what it is computed from elementwise (of its
  # size): an output among them is the rows the statistic reduces.
  while stack:
    name = stack.pop()
    if name in seen or name not in fused:
      continue
    seen.add(name)
    cur = fused.instruction(name)
    if cur.shape is None or not cur.shape.is_array or product(cur.shape.dims) != size:
      continue
    if name in outputs:
      found.append((outputs[name], product(operand.shape.dims[a] for a in axes)))
    if cur.opcode in opcodes.ELEMENTWISE or cur.opcode in ("bitcast", "copy", "convert"):
      stack.extend(cur.operands)
  return found


def _beside_record(program: Program, producer: Kernel, buf: Buffer, stat: Buffer,
                   row: int, reducer: str | None) -> FusionDecisionRecord | None:
  """The finding on `buf`, written by `producer` beside `stat` (its rows of
  `row` elements reduced by `reducer`), or None where some reader does not
  need the statistic or the statistic is no softmax's."""
  readers = consumer_kernels(program, buf)
  if not readers or len(readers) != len(buf.consumers) or \
      any(r.trip_count != producer.trip_count for r in readers):
    return None
  # The kernels reading the statistic, or a row-sized value computed from
  # it (its negation, its log): what needs the whole row reduced first.
  elements = product(stat.dims)
  needs, derived, stack = set(), set(), [stat]
  while stack:
    b = stack.pop()
    for c in b.consumers:
      needs.add(c)
      for w in program.writes.get(c, ()):
        if w.name not in derived and product(w.dims) == elements:
          derived.add(w.name)
          stack.append(w)
  if any(r.name not in needs for r in readers):
    return None  # a reader that does not wait for the statistic keeps the rows
  # A softmax's statistic: its row max, read by kernels taking exp, or a sum
  # of exp (forward, or the backward's rowsum(dP * P)); not a norm's moments.
  exp = {"exp", "exponential"}
  names = set(primitives(program, producer))
  if reducer not in ("maximum", "add") or (reducer == "add" and not names & exp):
    return None
  for c in needs:
    if c in program.kernels:
      names |= primitives(program, program.kernels[c])
  if not names & exp:
    return None
  gemms = anchor_of(program, producer) is not None and \
      all(anchor_of(program, r) is not None for r in readers)
  pattern = ("attention" if gemms else
             "log_softmax" if names & {"log", "log_softmax"} else "softmax")
  backward = "transpose(" in producer.op_name
  trip = producer.trip_count
  fix = (f"a fused attention kernel ({ATTENTION_KERNELS}) streams the rows with "
         "running statistics" if pattern == "attention" else
         f"a {pattern.replace('_', '-')} kernel holding each row of {row} elements "
         "computes the statistic and applies it on chip")
  return FusionDecisionRecord(
      kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
      consumers=tuple(r.name for r in readers), boundary=buf.name,
      boundary_shape=buf.shape, bytes_saved=times(buf.bytes * (1 + len(readers)), trip),
      launches_removed=times(len(readers) if pattern == "attention" else 0, trip),
      extra_arithmetic="the statistic and its use in one kernel: a running "
                       "statistic, or the row held on chip",
      extra_resources="one row (or a tile and its running statistics) on chip",
      numerical_class=NumericalClass.REASSOCIATED,
      guard="keep XLA's kernels where a row does not fit on chip",
      layout_effect="none",
      evidence=(f"{kernel_desc(producer)} writes {buf.shape} beside its row "
                f"reduction {stat.name} ({stat.shape}, {row} elements a row)"
                f"{' in the backward pass' if backward else ''}; "
                f"{', '.join(kernel_desc(r) for r in readers)} "
                f"{'reads' if len(readers) == 1 else 'read'} the rows with the "
                "statistic, so the rows are written until the whole row is reduced: "
                f"{fix}"),
      verdict=Verdict.RISKY,
      reasons=("a separate algorithmic phase: each reader needs its row's "
               "statistic before it reads the row",),
      risks=("numerical: reassociated sums change the last bits",
             "on-chip memory: a row or tile and its statistics lower occupancy") +
            COMMON_RISKS,
      ops=(pattern,), trip_count=trip, source=buf.source,
      computation=producer.computation,
      need=KernelNeed(FindingKind.SEPARATE_REDUCTION, pattern))


def _column_sum_gemm(program: Program, others: Sequence[str], stats) -> str | None:
  """The gemm among `others` (the buffer's other readers) that contracts the
  axes the column reduction sums (a weight gradient x^T @ dy beside dy's
  bias gradient): it could emit the column sums itself. None when none."""
  if stats is None or not stats.axes:
    return None
  per_statistic = product(stats.dims[a] for a in stats.axes)
  for name in others:
    k = program.kernels.get(name)
    if k is None or anchor_of(program, k) != "dot":
      continue
    try:
      mm = anchors.matmul_anchor(program.module, k.computation, k.name)
    except KeyError:
      continue
    if mm is None or mm.lhs_contracting is None:
      continue
    # The operand holding the buffer (perhaps as a bitcast of it) sums over
    # exactly what the reduction sums: its contracted and batch axes (XLA:GPU
    # batches a weight gradient over the batch axis, then adds the batches).
    for spec, summed in ((mm.lhs, (*mm.lhs_contracting, *mm.lhs_batch)),
                         (mm.rhs, (*mm.rhs_contracting, *mm.rhs_batch))):
      if product(spec.dims) == product(stats.dims) and \
          product(spec.dims[i] for i in summed) == per_statistic:
        return name
  return None


def _output_op_name(program: Program, producer: Kernel, buf: Buffer) -> str:
  """The op_name of the instruction computing `buf` (a multi-output
  fusion's other outputs carry the fusion's name: a forward pooled mean's,
  with a backward select beside it)."""
  found = fused_root(program.module, program.inst(producer), buf.index)
  return found[1].op_name if found is not None else ""


def _column_sum_conv(program: Program, buf: Buffer, others: Sequence[str],
                     stats) -> str | None:
  """The convolution among `others` that is the weight gradient reading
  `buf` as dy (dW sums dy over the batch and the output positions, keeping
  its output channels: what the column reduction keeps), or None. An input
  gradient or a forward convolution keeps the batch axis the reduction sums."""
  if stats is None or not stats.axes or tuple(stats.dims) != tuple(buf.dims):
    return None
  kept = set(stats.kept)
  for name in others:
    k = program.kernels.get(name)
    if k is None or anchor_of(program, k) != "convolution":
      continue
    inst = program.inst(k)
    at = operand_number(program, k, buf)
    if at is None:
      continue
    if bt.is_conv_call(inst):
      # cuDNN names the role: (x, dy) -> dW.
      if inst.custom_call_target == bt.CONV_BACKWARD_FILTER_TARGET and at == 1:
        return name
      continue
    dnums = inst.convolution_dimension_numbers if inst.opcode == "convolution" else None
    operand = program.comps[k.computation].instruction(inst.operands[at])
    if dnums is None or operand.shape is None or operand.shape.dims != buf.dims:
      continue
    # XLA writes dW as a convolution contracting dy's batch axis: dy as the
    # kernel ('i' the batch, 'o' the channel) or as the input ('f' the
    # batch, 'b' the channel).
    keep, contract = ((dnums.kernel_output_feature, dnums.kernel_input_feature) if at == 1
                      else (dnums.input_batch, dnums.input_feature))
    if {keep} == kept and contract in stats.axes:
      return name
  return None


def _is_reduction_kernel(program: Program, r: Kernel) -> bool:
  inst = program.inst(r)
  opcode, ops = inst.opcode, r.fused_ops
  if opcode == "reduce" and bt.is_split_k_reduce(inst):
    return False
  # XLA:CPU lowers some column sums (bias gradients) to reduce-window.
  if not (opcode in ("reduce", "reduce-window") or (
      ("reduce" in ops or "reduce-window" in ops)
      and "dot" not in ops and "convolution" not in ops
      and r.kind is not KernelKind.PALLAS)):
    return False
  comp = program.comps[r.computation]
  if opcode == "reduce-window" and _is_scan(comp, inst):
    return False  # a prefix sum or a sliding window: no statistics to fuse
  fused = fused_computation(program, r) if opcode != "reduce" else None
  if fused is not None and not _fused_reduces(program, fused):
    return False  # its reduce-windows are all scans
  # (Asked last: it looks through the fused computation.)
  return ops.get("reduce", 0) != 1 or split_k_site(program, r) is None


def _fed_operands(program: Program, r: Kernel) -> int | None:
  """The operands of reduction kernel `r` that reach one of its reduces
  (bit n: operand n; not a scatter's destination, say, or an output written
  beside); None for an unfused reduction, which reduces all of them. A
  split-K sum is its gemm's: partial sums count where what they sum is
  reduced further (a norm's statistics over the gemm's result)."""
  fused = fused_computation(program, r)
  if fused is None:
    return None
  masks = _reach_masks(program, fused, True)
  fed = 0
  for i in _fused_reduces(program, fused):
    fed |= masks.get(i.name, 0)
  return fed


def _fused_reduces(program: Program, fused: Computation) -> tuple[Instruction, ...]:
  """The reduce and reduce-window instructions of `fused`, in text order,
  less split-K sums (a gemm's own)."""
  found = program.tables.reduces.get(fused.name)
  if found is None:
    found = program.tables.reduces[fused.name] = tuple(
        i for i in fused.instructions
        if i.opcode in ("reduce", "reduce-window") and not bt.is_split_k_reduce(i)
        and not _is_scan(fused, i))
  return found


def _is_scan(comp: Computation, inst: Instruction) -> bool:
  """Whether `inst` is a reduce-window whose result keeps every dim of its
  operand (or pads it longer: `jnp.cumsum`'s last stage sums 3 block totals
  into 4 prefixes): a prefix sum (`jnp.cumsum`, `lax.associative_scan`) or
  a stride-1 sliding window, not a reduction to statistics. (XLA:CPU's first
  stage of a tree reduction is a reduce-window too, striding to fewer
  elements.)"""
  if inst.opcode != "reduce-window" or not inst.operands or inst.shape is None:
    return False
  src = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  if src is None or src.shape is None or not src.shape.is_array or not inst.shape.is_array:
    return False
  dims, out = tuple(src.shape.dims), tuple(inst.shape.dims)
  return len(dims) == len(out) and all(o >= d for d, o in zip(dims, out))


def _sums_partials(program: Program, r: Kernel, operand: int) -> bool:
  """Whether `r` reads its operand `operand` as a gemm's split-K partial
  sums (only a split-K reduce reads it, through bitcasts)."""
  fused = fused_computation(program, r)
  param = next((p for p in fused.parameters if p.parameter_number == operand),
               None) if fused is not None else None
  if param is None:
    return False
  users, stack = [], [param.name]
  while stack:
    for u in program.users(fused, stack.pop()):
      if u.opcode == "bitcast":
        stack.append(u.name)
      else:
        users.append(u)
  return bool(users) and all(bt.is_split_k_reduce(u) for u in users)


def _tree_stage(program: Program, producer: Kernel, buf: Buffer, r: Kernel) -> bool:
  """Whether `buf` holds partial results of one reduction XLA split over two
  kernels (a tree reduction: `producer` reduces part of the axes, `r`
  reduces the rest with the same reducer computation)."""
  if "reduce" not in producer.fused_ops and "reduce-window" not in producer.fused_ops and \
      producer.kind is not KernelKind.PALLAS:
    return False  # (a fusion's ops count its body's; a Pallas group's, its members')
  found = fused_root(program.module, program.inst(producer), buf.index)
  if found is None:
    return False
  comp, root = found
  root = through_bitcasts(comp, root.name) or root
  # XLA:CPU's first stage may be a reduce-window striding over the axis.
  if root.opcode not in ("reduce", "reduce-window") or _is_scan(comp, root):
    return False
  reducer = _reducer_name(root)
  operand = operand_number(program, r, buf)
  if reducer is None or operand is None:
    return False
  # The second stage reduces the partial results themselves, with the same
  # reducer (not a value computed from them, as a variance from a mean):
  # the same computation, or XLA's clone of it (`region_0.1.clone`).
  for where, i in _reduce_sites(program, r, operand):
    src = through_moves(where, i.operands[0]) if i.operands else None
    if _reducer_name(i) == reducer and src is not None and \
        src.opcode == "parameter" and src.parameter_number == operand:
      return True
  return False


def _fills_constant(program: Program, producer: Kernel, index: tuple[int, ...]) -> bool:
  """Whether `producer` writes its output `index` as a broadcast of a
  constant (zeros written beside a kernel's real output, which XLA then
  reads wherever that constant is compared with or added)."""
  found = fused_root(program.module, program.inst(producer), index)
  if found is None:
    return False
  where, root = found
  _, src = through_kernels(program, where, root.name, also=("broadcast", "convert"))
  return src is not None and src.opcode == "constant" and root.opcode != "constant"


def _scatters_into_constant(program: Program, producer: Kernel,
                            index: tuple[int, ...]) -> bool:
  """Whether `producer` writes its output `index` by a scatter whose
  destination holds one constant everywhere (a broadcast of a constant, in
  the kernel or written by the kernel before it) and whose updates may
  meet (not one per row)."""
  inst = program.inst(producer)
  comp = program.comps[producer.computation]
  found = fused_root(program.module, inst, index)
  where, root = found if found is not None else (comp, inst)
  root = through_bitcasts(where, root.name)
  if root is None or root.opcode != "scatter" or not root.operands:
    return False
  caller = inst if found is not None else None
  if one_per_row(program, where, root, caller, comp):
    return False  # one update per row: no two meet, each row is its update's
  _, dest = through_kernels(program, where, root.operands[0], caller, comp,
                            also=("broadcast", "convert"))
  return dest is not None and dest.opcode == "constant"


def _reducer_name(inst: Instruction) -> str | None:
  """The reducer computation's name, less the `.clone` suffixes XLA adds
  when it splits a reduction (`region_0.1.clone` is `region_0.1`)."""
  names = inst.called_computations.get("to_apply", ())
  if len(names) != 1:
    return None
  return re.sub(r"(\.clone(\.\d+)?)+$", "", names[0])


def reducer_op(program: Program, inst: Instruction) -> str | None:
  """The opcode combining a reduce's (or reduce-window's) elements: "add",
  "maximum", "minimum", "or", "and", "multiply"; None when its `to_apply`
  is not one op of its two parameters."""
  names = inst.called_computations.get("to_apply", ())
  if len(names) != 1 or names[0] not in program.module:
    return None
  comp = program.module.computation(names[0])
  root = comp.root
  if len(root.operands) != 2 or not all(
      o in comp and comp.instruction(o).opcode == "parameter" for o in root.operands):
    return None  # a variadic reducer (argmax's value and index), or more work
  return root.opcode


def _needs_later_values(program: Program, r: Kernel, buf: Buffer, producer: Kernel,
                        siblings: frozenset[str]) -> bool:
  """Whether reduction `r` reads a value computed from `producer`'s output,
  other than the results of the reductions in `siblings` read directly (the
  other statistics of the same buffer, which one fused kernel computes too)."""
  start, kernels = producer.time, program.kernels
  # Only what ran after the producer, beside it, can be computed from its
  # output: where no operand is, which operands feed the reduces is moot.
  later = [(n, p) for n, producers in enumerate(operand_producers(program, r))
           for p in producers if p != producer.name and p not in siblings and
           kernels[p].time > start and kernels[p].computation == producer.computation]
  if not later:
    return False
  inputs = _reduce_inputs(program, r, operand_number(program, r, buf))
  frontier = {p for n, p in later if inputs is None or inputs >> n & 1}
  seen: set[str] = set()
  while frontier:
    name = frontier.pop()
    if name in seen:
      continue
    seen.add(name)
    k = kernels[name]
    if k.time <= start or k.computation != producer.computation:
      continue  # ran before the producer (or elsewhere): not from its output
    for producers in operand_producers(program, k):
      for p in producers:
        if p == producer.name:
          return True
        if p not in seen:
          frontier.add(p)
  return False


def _reduce_inputs(program: Program, r: Kernel, operand: int | None) -> int | None:
  """The operands of fusion `r` the inputs of the reduces that its operand
  `operand` reaches are computed from (bit n: operand n; not those applied
  to a reduced result only, nor those of other reductions the kernel runs
  beside); None for an unfused reduce."""
  fused = fused_computation(program, r)
  if fused is None:
    return None
  # The first reduces the operand reaches: what reduces their results is the
  # small final combine, after the partial reductions.
  first = _reach_masks(program, fused, False) if operand is not None else None
  stack = [o for i in _fused_reduces(program, fused)
           if first is None or first.get(i.name, 0) >> operand & 1
           for o in i.operands[:max(1, len(i.operands) // 2)]]
  seen: set[str] = set()
  found = 0
  while stack:
    name = stack.pop()
    if name in seen or name not in fused:
      continue
    seen.add(name)
    inst = fused.instruction(name)
    if inst.opcode == "parameter":
      found |= 1 << inst.parameter_number
    stack.extend(inst.operands)
  return found


def _whole_normalization(program: Program, r: Kernel, buf: Buffer,
                         partials: bool = False) -> bool:
  """Whether `r` is an XLA Triton fusion holding a whole softmax or norm
  over `buf`: its reductions and the elementwise apply in one kernel, writing
  a result of `buf`'s size (with `partials`, of the size of what `r`'s
  split-K sum makes of `buf`)."""
  if r.kind is not KernelKind.TRITON_FUSION or "reduce" not in r.fused_ops:
    return False
  shape = program.inst(r).shape
  size = product(buf.dims)
  if partials:
    site = split_k_site(program, r)
    if site is None or site.shape is None or not site.shape.is_array:
      return False
    size = site.shape.num_elements
  return shape is not None and shape.is_array and shape.num_elements == size


#: The fused attention kernels a gemm -> softmax -> gemm chain needs.
ATTENTION_KERNELS = ('jax.nn.dot_product_attention(q, k, v, implementation="cudnn") '
                     "or a Pallas attention kernel")


def _attention_chain(program: Program, buf: Buffer, producer: Kernel,
                     softmaxes: list[Kernel]) -> FusionDecisionRecord | None:
  """One finding for gemm -> (XLA's one-kernel softmax) -> gemm: the scores
  and the probabilities are both written and read back; a fused attention
  kernel keeps them on chip. None when no gemm sits on both sides, or the
  kernel between them is no softmax."""
  if anchor_of(program, producer) != "dot":
    return None
  # A softmax between the gemms (its max, exp and sum; the backward recomputes
  # it), not a norm (an RMSNorm between a residual add and the next
  # projection reads a gemm and feeds one too).
  for r in softmaxes:
    names = primitives(program, r)
    if not names & {"exp", "exponential"} or not names & {"reduce_max", "max"}:
      return None
  probs = [b for r in softmaxes for b in program.writes.get(r.name, ())]
  readers = [c for b in probs for c in consumer_kernels(program, b)]
  if not probs or not readers or not all(anchor_of(program, c) == "dot" for c in readers):
    return None
  trip = producer.trip_count
  saved = 2 * buf.bytes + sum(2 * b.bytes for b in probs)
  backward = "transpose(" in producer.op_name
  return FusionDecisionRecord(
      kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
      consumers=tuple(r.name for r in softmaxes) + tuple(dict.fromkeys(c.name for c in readers)),
      boundary=buf.name, boundary_shape=buf.shape, bytes_saved=times(saved, trip),
      launches_removed=times(len(softmaxes) + 1, trip),
      extra_arithmetic="online softmax: running max and sum per row, rescaling "
                       "the accumulator",
      extra_resources="a query tile, key/value tiles and the running statistics "
                      "in shared memory and registers",
      numerical_class=NumericalClass.REASSOCIATED,
      guard="XLA's gemm, softmax and gemm where the fused kernel does not apply",
      layout_effect="none",
      evidence=(f"{kernel_desc(producer)} writes "
                f"{'the gradient of the attention probabilities' if backward else 'the attention scores'} "
                f"{buf.shape}; "
                f"{', '.join(kernel_desc(r) for r in softmaxes)} "
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
             "backward complexity: the fused kernel needs its own backward") + COMMON_RISKS,
      ops=("attention",), trip_count=trip, source=buf.source,
      computation=producer.computation,
      need=KernelNeed(FindingKind.SEPARATE_REDUCTION, "attention"))


def _reduce_sites(program: Program, r: Kernel,
                  operand: int | None = None) -> list[tuple[Computation, Instruction]]:
  """The reduce and reduce-window instructions a reduction kernel runs (a
  split-K sum is its gemm's, not one of them); with `operand`, those its
  operand `operand` reaches, where it reaches any."""
  inst = program.inst(r)
  comp = program.comps[r.computation]
  sites = [(comp, inst)] if inst.opcode in ("reduce", "reduce-window") else []
  fused = fused_computation(program, r)
  if fused is not None:
    sites += [(fused, i) for i in _fused_reduces(program, fused)]
    if operand is not None:
      masks = _reach_masks(program, fused, True)
      mine = [(c, i) for c, i in sites if masks.get(i.name, 0) >> operand & 1]
      sites = mine or sites
  return sites


def _reach_masks(program: Program, fused: Computation,
                 past_reduces: bool) -> dict[str, int]:
  """Instruction name -> the parameters of `fused` it is computed from (bit
  n: parameter n); without `past_reduces`, up to the first reduces (a
  split-K sum is no stop: it finishes a gemm) and not what is computed from
  their results. One pass over the computation for all its parameters, and
  for both kinds (the rules ask both, of each operand of every reduction)."""
  masks = program.tables.reached.get((fused.name, past_reduces))
  if masks is not None:
    return masks
  # Text order: XLA's parser, and ours, take no operand before its definition.
  both = _masks_in_order(fused)
  program.tables.reached[(fused.name, True)], program.tables.reached[(fused.name, False)] = both
  return both[0] if past_reduces else both[1]


def _masks_in_order(fused: Computation) -> tuple[dict[str, int], dict[str, int]]:
  """`_reach_masks` over `fused`'s instructions, past reduces and up to them."""
  # What an instruction passes on to its users, past reduces and up to them.
  flows: dict[str, int] = {}
  firsts: dict[str, int] = {}
  past: dict[str, int] = {}
  upto: dict[str, int] = {}
  for inst in fused.instructions:
    name = inst.name
    if inst.opcode == "parameter":
      flows[name] = firsts[name] = 1 << (inst.parameter_number or 0)
      past[name] = upto[name] = 0  # (a parameter is not computed from itself)
      continue
    mask = first = 0
    for o in _value_operands(inst):
      mask |= flows[o]
      first |= firsts[o]
    past[name] = flows[name] = mask
    upto[name] = first
    stops = inst.opcode in ("reduce", "reduce-window") and not bt.is_split_k_reduce(inst)
    firsts[name] = 0 if stops else first
  return past, upto


def _value_operands(inst: Instruction) -> tuple[str, ...]:
  """The operands whose values `inst` passes on: a gather's, dynamic
  slice's or scatter's indices only choose where (a sum of the values
  gathered at cell hashes sums no hash)."""
  ops = inst.operands
  if inst.opcode in ("gather", "dynamic-slice"):
    return ops[:1]
  if inst.opcode == "dynamic-update-slice":
    return ops[:2]
  if inst.opcode == "scatter" and len(ops) % 2 == 1:
    n = len(ops) // 2  # (n inputs, the indices, n updates)
    return ops[:n] + ops[n + 1:]
  return ops


def _reduced_dims(comp: Computation, inst: Instruction) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
  """(operand dims, reduced axes) of a reduce; for a reduce-window, the axes
  its window spans. A reduce of another reduce's result in the same
  computation (XLA reduces dims {0,2} as {2}, then {0}) counts as one,
  over the first one's operand."""
  if not inst.operands:
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


def _later_stages(program: Program, r: Kernel, comp: Computation, inst: Instruction,
                  dims: tuple[int, ...], axes: tuple[int, ...]
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(dims, axes) of the reduction `inst` of kernel `r` begins, where XLA
  runs it in stages over several kernels (a row max over 32768 words as
  [256,128,256] reduced over {2}, then the [256,128] partials over {1} by
  the next kernel; a bias gradient summed over the tokens, then over the
  batch): each later kernel reducing the partial results themselves, as
  `r` writes them, with the same reducer adds its axes."""
  for _ in range(4):  # (a tree has few stages)
    nxt = _next_stage(program, r, comp, inst)
    if nxt is None:
      break
    r, comp, inst, second = nxt
    kept = [a for a in range(len(dims)) if a not in axes]
    if len(kept) != len(comp.instruction(inst.operands[0]).shape.dims):
      break
    axes = tuple(sorted(set(axes) | {kept[a] for a in second}))
  return dims, axes


def _widest_reduce(program: Program, r: Kernel, buf: Buffer):
  """((operand dims, reduced axes), (computation, reduce)) of the reduction
  kernel's widest reduce of `buf` (of all its reduces where none reads
  `buf`); (None, None) where it has none."""
  best = site = None
  for comp, inst in _reduce_sites(program, r, operand_number(program, r, buf)):
    found = _reduced_dims(comp, inst)
    if found is not None and (best is None or (len(found[0]), len(found[1])) >
                              (len(best[0]), len(best[1]))):
      best, site = found, (comp, inst)
  return best, site


def _stage_kernels(program: Program, r: Kernel, buf: Buffer) -> list[Kernel]:
  """`r` and the kernels reducing its partial results further (`_next_stage`
  from its widest reduce of `buf`)."""
  _, site = _widest_reduce(program, r, buf)
  out = [r]
  while site is not None and len(out) < 5:
    nxt = _next_stage(program, out[-1], *site)
    if nxt is None:
      break
    out.append(nxt[0])
    site = nxt[1], nxt[2]
  return out


def _next_stage(program: Program, r: Kernel, comp: Computation, inst: Instruction
                ) -> tuple[Kernel, Computation, Instruction, tuple[int, ...]] | None:
  """The kernel reducing what reduce `inst` (in `r`) writes, as written (a
  reduce of the kernel's parameter, through bitcasts, by the same reducer
  computation): (that kernel, its computation, its reduce, the axes it
  reduces); None when no kernel does."""
  if inst.opcode != "reduce" or comp.name == r.computation:
    return None
  root = comp.root
  index: tuple[int, ...] = ()
  if root.opcode == "tuple":
    hits = [j for j, o in enumerate(root.operands)
            if (through_bitcasts(comp, o) or root).name == inst.name]
    if len(hits) != 1:
      return None
    index = (hits[0],)
  elif (through_bitcasts(comp, root.name) or root).name != inst.name:
    return None
  reducer = _reducer_name(inst)
  for buf in program.writes.get(r.name, ()):
    if buf.index != index:
      continue
    for c in consumer_kernels(program, buf):
      operand = operand_number(program, c, buf)
      if operand is None or c.trip_count != r.trip_count:
        continue
      for where, i in _reduce_sites(program, c, operand):
        src = through_bitcasts(where, i.operands[0]) if i.operands else None
        if i.opcode == "reduce" and i.dimensions and _reducer_name(i) == reducer and \
            src is not None and src.opcode == "parameter" and \
            src.parameter_number == operand and \
            where.instruction(i.operands[0]).shape.dims == src.shape.dims:
          return c, where, i, tuple(sorted(i.dimensions))
  return None


def _map_axes(src: tuple[int, ...], axes: tuple[int, ...],
              dst: tuple[int, ...]) -> tuple[int, ...] | None:
  """`axes` of `src` as axes of `dst`, a reshape of it, where the reduced
  axes are a leading or trailing run whose element count `dst` splits the
  same way (e.g. {1} of [128,64] is {2} of [8,16,64]); None otherwise."""
  if src == dst:
    return axes
  if product(src) != product(dst) or not axes:
    return None
  n = product(src[a] for a in axes)
  if axes == tuple(range(len(src) - len(axes), len(src))):
    for k in range(len(dst), 0, -1):
      if product(dst[k - 1:]) == n:
        return tuple(range(k - 1, len(dst)))
  elif axes == tuple(range(len(axes))):
    for k in range(1, len(dst) + 1):
      if product(dst[:k]) == n:
        return tuple(range(k))
  return None


def _statistics(program: Program, r: Kernel, buf: Buffer) -> Statistics | None:
  """What the reduction kernel's widest reduce of `buf` reduces (the widest
  of all its reduces where none reads `buf`), in `buf`'s dims where the two
  are reshapes of each other, with the scale applied beside."""
  best, site = _widest_reduce(program, r, buf)
  if best is None:
    return None
  dims, axes = _later_stages(program, r, *site, *best)
  mapped = _map_axes(dims, axes, tuple(buf.dims))
  if mapped is not None:
    dims, axes = tuple(buf.dims), mapped
  return Statistics(dims, axes, _affine(program, r, buf, dims, axes))


def _affine(program: Program, r: Kernel, buf: Buffer, dims: tuple[int, ...],
            axes: tuple[int, ...]) -> tuple[int, ...] | None:
  """The dims of a scale broadcast over exactly the reduced axes (gamma) in
  the kernels around the reduction: the boundary's readers and the readers
  of what the reduction writes."""
  by_kernel = _broadcasts(program).get(dims)
  if not by_kernel:
    return None
  near = {c for c in buf.consumers} | {c for b in program.writes.get(r.name, ())
                                       for c in b.consumers}
  near |= {c for name in tuple(near) for b in program.writes.get(name, ())
           for c in b.consumers}
  # The first kernel by name with such a scale; in it, the first such
  # broadcast (their dimensions decoded only here, for the near kernels).
  for name in sorted(near.intersection(by_kernel)):
    for i, src in by_kernel[name]:
      if tuple(i.dimensions or ()) == axes:
        return tuple(src.shape.dims)
  return None


def _broadcasts(program: Program) -> dict[tuple[int, ...],
                                          dict[str, list[tuple[Instruction, Instruction]]]]:
  """Result dims -> kernel name -> (broadcast, the parameter it
  broadcasts) of each of the fusion's broadcasts of a parameter (through
  bitcasts), in text order, made once per audit."""
  table = program.tables.broadcasts
  if table is None:
    table = program.tables.broadcasts = {}
    for k in program.kernels.values():
      # (A fusion's ops count its body's; a Pallas group's, its members'.)
      if "broadcast" not in k.fused_ops and k.kind is not KernelKind.PALLAS:
        continue
      fused = fused_computation(program, k)
      if fused is None:
        continue
      for i in [i for i in fused.instructions if i.opcode == "broadcast"]:
        if i.shape is not None and i.operands:
          src = through_bitcasts(fused, i.operands[0])
          if src is not None and src.opcode == "parameter":
            table.setdefault(tuple(i.shape.dims), {}).setdefault(k.name, []).append((i, src))
  return table


def _reducer_of(program: Program, r: Kernel, buf: Buffer) -> str | None:
  """The op combining the elements `r` reduces `buf` by (`reducer_op` of
  the first reduce it reaches)."""
  operand = operand_number(program, r, buf)
  for _, site in _reduce_sites(program, r, operand):
    op = reducer_op(program, site)
    if op is not None:
      return op
  return None


#: Patterns of reductions that are tests, not sums: by their reducer.
_TESTS = {"or": "any", "and": "all"}


def _reduction_pattern(program: Program, r: Kernel, producer: Kernel,
                       stats: Statistics | None, buf: Buffer,
                       reducer: str | None = None) -> str | None:
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
  # producer's own ops say nothing: x_hat holds an rsqrt too). Each kernel's
  # primitives are read only as far as the answer needs them.
  # (A reduction XLA stages over several kernels: what reads its last stage.)
  stages = _stage_kernels(program, r, buf)
  after = stages + [program.kernels[c] for k in stages
                    for b in program.writes.get(k.name, ())
                    for c in b.consumers if c in program.kernels]
  backward = "transpose(" in r.op_name or "transpose(" in producer.op_name
  if reducer in _TESTS:
    return _TESTS[reducer]  # jnp.any / jnp.all: a mask's test, not statistics
  if stats is not None and stats.axes and len(stats.axes) == len(stats.dims) and \
      reducer in ("add", None):
    # Every element into one value: a loss total, a global norm's sum of
    # squares (optax.clip_by_global_norm); no bias, gamma or batch axis.
    return "sum_of_squares" if _sums_squares(program, r, buf) else "total"
  if stats is not None:
    rank, axes = len(stats.dims), stats.axes
    trailing = bool(axes) and axes == tuple(range(rank - len(axes), rank)) and len(axes) < rank
    if not trailing:
      if not backward and any("rsqrt" in primitives(program, k) for k in after):
        if 0 not in axes:
          return "group_norm_stats"
        # Batch statistics keep the channels alone. One axis summed of
        # squares, the others kept, is a per-row RMS norm over an axis held
        # first (penzai's RMSNorm over the embedding of [e, b, t]).
        if len(axes) == rank - 1:
          return "batch_norm_stats"
        return "rms_norm" if len(axes) == 1 and _sums_squares(program, r, buf) else None
      leading = rank >= 2 and axes == tuple(range(len(axes)))
      if (not leading or not backward) and _contracts(program, r, buf):
        return "contraction"
      if leading:
        return "column_reduction"
      return None
  if backward:
    return "norm_backward" if any("rsqrt" in primitives(program, k)
                                  for k in (producer, *after)) else None
  names = set(primitives(program, producer))
  for k in after:
    names |= primitives(program, k)
  if "rsqrt" in names:
    return "layer_norm" if names & {"sub", "subtract"} else "rms_norm"
  if names & {"exp", "exponential"} and names & {"reduce_max", "max"}:
    # log_softmax (cross-entropy) takes the log of the sum: not a softmax.
    return "log_softmax" if names & {"log", "log_softmax"} else "softmax"
  # A matrix-vector product XLA runs as multiply + reduce (a Dense(1)).
  return "contraction" if _contracts(program, r, buf) else None


def _sums_squares(program: Program, r: Kernel, buf: Buffer) -> bool:
  """Whether `r` reduces the square of `buf` (x * x, or x ** 2 as a power)."""
  operand = operand_number(program, r, buf)
  fused = fused_computation(program, r)
  if operand is None or fused is None:
    return False
  for comp, red in _reduce_sites(program, r, operand):
    if not red.operands:
      continue
    sq = through_moves(comp, red.operands[0])
    if sq is None:
      continue
    if sq.opcode == "multiply" and len(sq.operands) == 2 and len(set(sq.operands)) == 1:
      return True
    if sq.opcode == "power" and len(sq.operands) == 2 and sq.operands[1] in comp:
      exp = comp.instruction(sq.operands[1])
      while exp.opcode in ("broadcast", "convert") and exp.operands and exp.operands[0] in comp:
        exp = comp.instruction(exp.operands[0])
      if exp.opcode == "constant" and (exp.literal or "").strip() in ("2", "2.0", "{2}"):
        return True
  return False


def _contracts(program: Program, r: Kernel, buf: Buffer) -> bool:
  """Whether `r` reduces a product of `buf` with another value that varies
  along the reduced axes (an einsum contraction such as mixing experts'
  outputs by their weights), not a sum or a scaled sum of `buf` alone."""
  operand = operand_number(program, r, buf)
  fused = fused_computation(program, r)
  if operand is None or fused is None:
    return False
  first = _reach_masks(program, fused, False)
  for comp, red in _reduce_sites(program, r, operand):
    if red.opcode != "reduce" or not first.get(red.name, 0) >> operand & 1 or \
        not red.dimensions:
      continue
    prod = through_moves(comp, red.operands[0])
    if prod is None or prod.opcode != "multiply" or prod.shape is None or \
        len(set(prod.operands)) != 2:
      continue  # (x * x is a square: a sum of squares, no contraction)
    axes = set(red.dimensions)
    if all(_varies_along(comp, o, axes, prod.shape.dims) for o in prod.operands) and \
        not any(_relu6_gate(program, r, comp, o) for o in prod.operands):
      return True
  return False


def _relu6_gate(program: Program, r: Kernel, comp: Computation, name: str,
                depth: int = 2) -> bool:
  """Whether `name` (in `r`'s fused computation `comp`) is relu6(x + 3),
  perhaps times 1 / 6, computed here or by the kernel that wrote it: its
  product with x is hard-swish, an activation, not an einsum's operand."""
  caller, outer = program.inst(r), program.comps[r.computation]
  where, found = through_kernels(program, comp, name, caller, outer)
  if found is None:
    return False
  if found.opcode == "clamp":
    return _is_relu6(where, found)
  # (relu6(x + 3) * (1 / 6), the 1 / 6 perhaps broadcast by another kernel;
  # not hard-swish's own x * relu6(x + 3) / 6, whose product with dy is a
  # gradient's contraction)
  if depth <= 0 or found.opcode != "multiply" or len(found.operands) != 2:
    return False
  if where is not comp:
    # The kernel writing it scales the clamp itself: read it there.
    return any(
        _is_scale(where.instruction(scale)) and _is_relu6(where, where.instruction(gate))
        for gate, scale in (found.operands, found.operands[::-1])
        if gate in where and scale in where)
  for gate, scale in (found.operands, found.operands[::-1]):
    _, c = through_kernels(program, comp, scale, caller, outer)
    if c is not None and _is_scale(c) and _relu6_gate(program, r, comp, gate, depth - 1):
      return True
  return False


def _is_scale(c: Instruction) -> bool:
  """A constant scalar, or a scalar broadcast (`dimensions={}`)."""
  return ((c.opcode == "constant" and c.shape is not None and not c.shape.dims) or
          (c.opcode == "broadcast" and not c.dimensions))


def _is_relu6(comp: Computation, c: Instruction) -> bool:
  """clamp(0, x, 6)."""
  if c.opcode != "clamp" or len(c.operands) != 3 or not all(o in comp for o in c.operands):
    return False
  low, high = (comp.instruction(o) for o in (c.operands[0], c.operands[2]))
  return _scalar(comp, low) == 0.0 and _scalar(comp, high) == 6.0


def _scalar(comp: Computation, inst: Instruction) -> float | None:
  """A constant's value, through broadcasts; None for anything else."""
  while inst.opcode in ("broadcast", "bitcast") and inst.operands and inst.operands[0] in comp:
    inst = comp.instruction(inst.operands[0])
  try:
    return float((inst.literal or "").strip()) if inst.opcode == "constant" else None
  except ValueError:
    return None


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
    "total": "every element summed into one value (a loss total, a norm)",
    "sum_of_squares": ("a sum of squares of every element (a squared-error loss, a "
                       "global norm such as optax.clip_by_global_norm's)"),
    "any": "an any() test over the reduced axes (a threshold or mask check)",
    "all": "an all() test over the reduced axes (a threshold or mask check)",
    "contraction": ("a product summed over the reduced axes: an einsum contraction "
                    "XLA runs as multiply + reduce (e.g. mixing experts' outputs by "
                    "their routing weights)"),
    "norm_backward": ("a normalization's backward pass: the norm's kernel, called "
                      "in the forward, runs it as one pass over dy"),
}


def _reduction_text(pattern: str | None, stats: Statistics | None, buf: Buffer,
                    backward: bool, reducer: str | None = None) -> str:
  """What the HLO reduces, in words: the pattern (where one is known) and
  the axes, e.g. "per-sample statistics ...: reduces dims {1,2,4} of
  [8,32,32,8,4] (batch axis 0 kept; one result per index of axes 0,3)"."""
  key = f"{pattern}:forward" if not backward and f"{pattern}:forward" in _PATTERN_TEXT \
      else pattern
  if pattern == "column_reduction" and reducer in _EXTREMA:
    # A max or min over the leading axes is no sum: not a gradient, not a mean.
    parts = [f"a {_EXTREMA[reducer]} over the leading axes"]
  else:
    parts = [_PATTERN_TEXT[key]] if key in _PATTERN_TEXT else []
  if stats is not None and pattern not in ("layer_norm", "rms_norm", "softmax"):
    kept = stats.kept
    # A contraction's axes are the einsum's (experts, heads): axis 0 need
    # not be the batch.
    batch = ("" if len(stats.dims) < 2 or pattern in _NO_BATCH else
             "batch axis 0 kept" if 0 in kept else "batch axis 0 reduced")
    per = (f"one result per index of axes {_axes_text(kept)}" if kept else
           "one result")
    parts.append(f"reduces {stats.describe().replace(' per statistic', ' each')} "
                 f"({', '.join(p for p in (batch, per) if p)})")
  return ": ".join(parts)


_EXTREMA = {"maximum": "max", "minimum": "min"}
#: Patterns whose axis 0 is not said to be the batch: an einsum's axes
#: (experts, heads), and reductions of every element or a mask's test.
_NO_BATCH = frozenset({"contraction", "total", "sum_of_squares", "any", "all"})


def _axes_text(axes: Sequence[int]) -> str:
  return "{" + ",".join(map(str, axes)) + "}"


def _saved_normalized(program: Program, buf: Buffer, producer: Kernel,
                      reductions: list[Kernel],
                      others: list[str]) -> FusionDecisionRecord | None:
  """x_hat (or x - mean) written by the forward pass for one backward
  reduction that multiplies it by the incoming gradient and reduces (a gamma
  gradient, a norm's backward term): the reduction can recompute it from x
  and the per-row statistics, so the buffer is never written or kept."""
  if others or len(reductions) != 1:
    return None
  r = reductions[0]
  if not _reads_statistics(program, producer, buf) or not _multiplies_then_reduces(program, r, buf):
    return None
  sole = len(program.writes.get(producer.name, ())) == 1
  # The reader loads x instead of x_hat: where the producer runs on for its
  # other outputs, that load is new traffic.
  added = 0 if sole else max((_operand_bytes(program, producer, o)
                              for o in range(len(program.inst(producer).operands))),
                             default=0)
  trip = producer.trip_count
  stats = _statistics(program, r, buf)
  axes = f" ({stats.describe()})" if stats is not None else ""
  return FusionDecisionRecord(
      kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
      consumers=(r.name,), boundary=buf.name, boundary_shape=buf.shape,
      bytes_saved=times(max(0, 2 * buf.bytes - added), trip),
      launches_removed=times(1 if sole else 0, trip),
      extra_arithmetic="the reduction recomputes (x - mean) * rstd on load",
      extra_resources="the per-row statistics tile",
      numerical_class=NumericalClass.SAME_OPS,
      guard="keep the saved buffer where x itself is not kept for the backward pass",
      layout_effect="none",
      evidence=(f"{kernel_desc(producer)} writes {buf.shape} in the forward pass from "
                f"x and its statistics, and only {kernel_desc(r)} reads it, in the "
                f"backward pass, multiplying it by the incoming gradient and reducing"
                f"{axes}: a normalized input saved for one reduction"),
      verdict=Verdict.SAFE,
      reasons=("cheap recomputation: x_hat from x and compact statistics",
               "tile-local partial reductions"),
      risks=("peak: x must be kept for the backward pass instead",) + COMMON_RISKS,
      ops=("norm_backward", "recompute x_hat"), trip_count=trip, source=buf.source,
      computation=producer.computation)


def _reads_statistics(program: Program, producer: Kernel, buf: Buffer) -> bool:
  """Whether `producer` combines a full-size input with a smaller value a
  reduction wrote (a mean, an rstd): how x_hat and x - mean are made."""
  for producers in operand_producers(program, producer):
    for p in producers:
      k = program.kernels.get(p)
      if k is None:
        continue
      small = any(b.bytes < buf.bytes for b in program.writes.get(p, ()))
      if small and (_is_reduction_kernel(program, k) or "rsqrt" in primitives(program, k)):
        return True
  return False


def _multiplies_then_reduces(program: Program, r: Kernel, buf: Buffer) -> bool:
  """Whether the reduction multiplies `buf` by another full-size operand
  (the incoming gradient) before reducing."""
  fused = fused_computation(program, r)
  operand = operand_number(program, r, buf)
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
    src = through_bitcasts(fused, other[0]) if other else None
    if src is not None and src.opcode == "parameter" and src.shape is not None and \
        src.shape.num_elements == product(buf.dims):
      return True
  return False


def _operand_bytes(program: Program, k: Kernel, operand: int) -> int:
  name = program.inst(k).operands[operand]
  return sum(program.dataflow.values[v].byte_size for _, v in program.dataflow.holds.get(name, ()))
