"""Unfused epilogues: matmul results written for work the matmul's store could do.

One reader applying bias, activation, residual, scale, cast or quantization
to the result, or several readers each reading it elementwise or a slice of
it (an LSTM's gate split, an optimizer's moment updates): one epilogue could
write every reader's result and the matmul's output is never stored. Work
that needs the whole result first (statistics, gradients) is not epilogue.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import Buffer, Lifetime
from hlo_audit._src.analysis.detectors.common import (COMMON_RISKS, activation_of,
                                                      anchor_of, consumer_kernels,
                                                      VALUE_OPS, fused_computation,
                                                      kernel_desc, name_through,
                                                      operand_number, operand_producers,
                                                      primitive, product, sigmoid_input,
                                                      through_bitcasts, times)
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             KernelNeed, NumericalClass, Verdict)
from hlo_audit._src.hlo import dtypes, opcodes
from hlo_audit._src.hlo.ir import Computation, Instruction


def find(program: Program) -> tuple[FusionDecisionRecord, ...]:
  """Matmul results written to memory for elementwise work a matmul's
  epilogue could do: one reader applying it, or several readers each
  reading the result elementwise or a slice of it."""
  out: list[FusionDecisionRecord] = []
  for k in program.kernels.values():
    anchor = anchor_of(program, k)
    if anchor is None:
      continue
    inst = program.inst(k)
    for buf in program.writes.get(k.name, ()):
      if buf.lifetime in (Lifetime.EXTERNAL_OUTPUT, Lifetime.WORKSPACE) or buf.internal:
        continue
      consumers = consumer_kernels(program, buf)
      if len(consumers) > 1:
        multi = _multi_epilogue(program, k, anchor, buf, consumers)
        if multi is not None:
          out.append(multi)
        continue
      if len(consumers) != 1:
        continue
      consumer = consumers[0]
      operand = operand_number(program, consumer, buf)
      if operand is None:
        continue
      if _depends_on(program, consumer, k.name, operand):
        continue  # needs statistics of the whole result: not an epilogue
      work = _epilogue_work(program, consumer, operand, buf)
      if work is None and _store_into_slice(program, consumer, buf):
        work = ("store into slice",)
      if work is None:
        work = _epilogue_work(program, consumer, operand, buf, slices=True)
      if work is None:
        continue
      if "glu" not in work and _glu_partner(program, k, consumer, operand):
        work = ("glu", "multiply") + _glu_activation(program, consumer, work) + tuple(
            w for w in work if w not in ("product", "elementwise"))
      epilogue = bt.gemm_epilogue(inst)
      evidence = (f"{kernel_desc(k)} writes its {anchor} result {buf.shape} to memory; "
                  f"{kernel_desc(consumer)} reads it once to apply "
                  f"{', '.join(work)}")
      numerical = _numerical_class(buf, work)
      work = _applied(work)
      if "glu" in work:
        evidence += (" (a GLU: the activation of one part of the result times the "
                     "other, the gate and up projections computed as one gemm)")
      derivative = next((w.partition(":")[2] for w in work
                         if w.startswith("activation_grad:")), "")
      if derivative:
        evidence += (f" (the gradient times {derivative}'s derivative at a pre-activation "
                     "the forward pass wrote: the backward of a dense layer's activation, "
                     "which cuBLASLt's DGELU epilogue fuses into the gemm)")
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
      if program.has_backward:
        risks.append("backward complexity: the fused op needs a custom VJP "
                     "(dAct fused with the bias gradient)")
      risks += list(COMMON_RISKS)
      out.append(FusionDecisionRecord(
          kind=FindingKind.UNFUSED_EPILOGUE, producer=k.name,
          consumers=(consumer.name,), boundary=buf.name, boundary_shape=buf.shape,
          bytes_saved=times(2 * buf.bytes, k.trip_count),
          launches_removed=times(1, k.trip_count),
          extra_arithmetic="none: the epilogue's elementwise ops move into the "
                           "matmul's store",
          extra_resources=_resources(work),
          numerical_class=numerical,
          guard="no kernel covers all of this epilogue",
          layout_effect=f"none: the result keeps layout {str(inst.shape.layout) if inst.shape is not None and inst.shape.layout else '{}'}",
          evidence=evidence, verdict=verdict, reasons=tuple(reasons),
          risks=tuple(risks), ops=work, trip_count=k.trip_count,
          source=buf.source, computation=k.computation,
          need=_need(anchor, work)))
  return tuple(out)


#: Ops a kernel may run and still be same-index work (an epilogue chain).
_SAME_INDEX_OPS = opcodes.ELEMENTWISE | {"bitcast", "broadcast", "reshape", "constant",
                                         "parameter", "iota", "tuple", "get-tuple-element"}


def _same_index(program: Program, k: Kernel) -> bool:
  found = program.tables.same_index.get(k.name)
  if found is None:
    inst = program.inst(k)
    if inst.opcode == "fusion":
      found = k.kind is KernelKind.LOOP_FUSION and set(k.fused_ops) <= _SAME_INDEX_OPS
    else:
      found = inst.opcode in opcodes.ELEMENTWISE
    program.tables.same_index[k.name] = found
  return found


def _depends_on(program: Program, consumer: Kernel, anchor: str, operand: int,
                depth: int = 8) -> bool:
  """Whether an operand of `consumer` other than `operand` is computed from
  `anchor`'s output through a kernel that mixes elements (a BatchNorm apply
  reads the conv output and its batch statistics, reductions of that
  output; an activation's backward reads the incoming gradient): such work
  needs the whole result first and cannot be an epilogue. A path through
  elementwise kernels only (GELU split over two fusions) is same-index work
  one epilogue can do."""
  # A backward reader of a forward result needs the gradients, unless it
  # reads nothing else (a forward value widened or relaid out only for a
  # backward dot).
  if "transpose(" in consumer.op_name and anchor in program.kernels and \
      "transpose(" not in program.kernels[anchor].op_name and \
      _reads_another_array(program, consumer, operand):
    return True
  # (kernel, whether the path from it back to here mixed elements)
  frontier: set[tuple[str, bool]] = {
      (p, False) for i, producers in enumerate(operand_producers(program, consumer))
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
      k = program.kernels[name]
      mixed = mixed or not _same_index(program, k)
      for producers in operand_producers(program, k):
        for p in producers:
          if (p, mixed) not in seen:
            nxt.add((p, mixed))
    if not nxt:
      return False
    frontier = nxt
  return (anchor, True) in frontier


def _reads_another_array(program: Program, consumer: Kernel, operand: int) -> bool:
  """Whether `consumer` reads an array (more than a scalar) besides its
  operand `operand`."""
  comp = program.comps[consumer.computation]
  for i, o in enumerate(program.inst(consumer).operands):
    src = comp.instruction(o) if o in comp else None
    if i != operand and (src is None or src.shape is None or
                         not src.shape.is_array or src.shape.num_elements > 1):
      return True
  return False


def _epilogue_work(program: Program, consumer: Kernel, operand: int,
                   anchor_buf: Buffer, slices: bool = False) -> tuple[str, ...] | None:
  """What `consumer` does to its operand `operand` (the anchor's output), as
  epilogue items ("bias", "activation:gelu", "residual", "cast:bf16", ...);
  None when it does more than elementwise work on it. With `slices`, a
  slice is elementwise work too ("slice": the anchor stores that part; a
  convolution's input gradient padded as its forward input was)."""
  inst = program.inst(consumer)
  if inst.opcode in opcodes.ELEMENTWISE and inst.opcode != "copy":
    comp = program.comps[consumer.computation]
    return _classify_elementwise(comp, [inst], {}, anchor_buf)
  fused = fused_computation(program, consumer)
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
  if any(u.opcode == "slice" for u in chain) and "glu" not in work:
    work = ("slice",) + tuple(w for w in work if w != "elementwise")
  # A reader writing several results of the value (adam's parameter and both
  # moments) needs an epilogue that writes them all.
  root = fused.root
  outputs = sum(o in seen for o in root.operands) if root.opcode == "tuple" else 1
  if outputs == 3 and _adam_update(fused, chain, params[operand].name, root):
    # The optimizer's update of one weight (its parameter and both moments
    # from the gradient): the gemm computing the gradient can apply it per
    # tile, and the gradient is never written.
    work = ("adam",) + tuple(w for w in work if w.startswith(("cast:", "round:", "transpose")))
  return ((f"outputs:{outputs}",) + work) if outputs > 1 else work


def _adam_update(comp: Computation, chain: Sequence[Instruction], g: str,
                 root: Instruction) -> bool:
  """Whether the elementwise work on gradient `g` is an Adam-style update:
  it squares the gradient (the second moment), takes a square root (the
  step's denominator), and writes three arrays of the gradient's size (the
  parameter and the two moments: optax's adam/adamw, keras' Adam)."""
  names = {i.name for i in chain} | {g}
  squares = any(i.opcode == "multiply" and len(i.operands) == 2 and
                i.operands[0] == i.operands[1] and i.operands[0] in names for i in chain)
  roots = any(i.opcode in ("sqrt", "rsqrt") for i in chain)
  grad = comp.instruction(g).shape
  if not (squares and roots) or grad is None or root.opcode != "tuple":
    return False
  outs = [comp.instruction(o).shape for o in root.operands if o in names]
  return len(outs) == 3 and all(
      o is not None and o.is_array and o.num_elements == grad.num_elements for o in outs)


#: Epilogue work that moves or cuts the result without arithmetic.
_MOVES_ONLY = frozenset({"transpose", "slice", "store into slice"})


def _numerical_class(buf: Buffer, work: tuple[str, ...]) -> NumericalClass:
  """How a fused store's values compare with the reader's: work done on the
  f32 accumulator skips the rounding of a low-precision result (or the
  reader's own "round:" trip through a narrower type); work that only moves
  the result writes the same values."""
  if all(w in _MOVES_ONLY for w in work):
    return NumericalClass.SAME_OPS
  low_precision = buf.dtype in ("bf16", "f16") or buf.dtype.startswith("f8")
  if low_precision or any(w.startswith("round:") for w in work):
    return NumericalClass.MORE_PRECISE
  return NumericalClass.SAME_OPS


def _applied(work: tuple[str, ...]) -> tuple[str, ...]:
  """The work a fused store applies: a rounding through a narrower type is
  skipped on the accumulator (it stays where it is all the reader does)."""
  return tuple(w for w in work if not w.startswith("round:")) or work


def _need(anchor: str, work: tuple[str, ...]) -> KernelNeed:
  """What a kernel must compute to take `work` into the `anchor`'s store; a
  GLU's gemm is a GLU kernel's (both projections and the gated product)."""
  if "glu" in work:
    return KernelNeed(FindingKind.UNFUSED_EPILOGUE, "glu",
                      tuple(w for w in work if w != "glu"), outputs=_outputs_of(work))
  return KernelNeed(FindingKind.UNFUSED_EPILOGUE, anchor, work, outputs=_outputs_of(work))


def _outputs_of(work: Sequence[str]) -> int:
  """The outputs an epilogue's work writes ("outputs:3" -> 3; else 1)."""
  return next((int(w.partition(":")[2]) for w in work if w.startswith("outputs:")), 1)


def _classify_elementwise(comp: Computation, chain: list[Instruction],
                          params: Mapping[int, Instruction],
                          anchor_buf: Buffer, anchor_param: str = "") -> tuple[str, ...]:
  names = {primitive(i) for i in chain}
  opcodes_ = {i.opcode for i in chain}
  items: list[str] = []
  # The anchor's own value and everything computed from it are not "other"
  # operands (a bias or residual comes from elsewhere).
  chain_names = {i.name for i in chain} | {anchor_param}
  out_dims = anchor_buf.dims
  # Bias, residual and scale act on the anchor's value itself (or on a bias
  # or scale of it, or on it moved: a transposing store writes the tile at
  # its place, and sgd adds the weight to a gradient transposed to the
  # weight's layout) as that value's only use, with an operand from outside
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
          "add", "subtract", "multiply", "bitcast", "reshape", "convert", "transpose",
          "copy"):
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
            src.shape is not None and src.shape.num_elements < max(1, product(out_dims)):
          items.append("bias")
      elif other.opcode == "constant":
        items.append("bias")
      elif other.opcode == "parameter" and other.shape is not None and \
          other.shape.num_elements == product(out_dims):
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
        if base.shape.num_elements < product(out_dims):
          items.append("scale")
        else:
          items.append("product")
  activation = activation_of(names, opcodes_, comp, chain)
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
  # A convert is a cast only where the work writes its type: a bf16
  # activation computed in f32 and rounded back casts nothing, and an f32
  # result rounded to bf16 and widened back (the model's bf16 value, which
  # XLA:CPU's f32 dot leaves its reader to round) is a rounding the fused
  # store skips, not the output's dtype.
  written = _written_types(chain)
  converts = [i for i in chain if i.opcode == "convert" and i.shape is not None]
  for c in converts:
    t = c.shape.element_type
    if dtypes.is_integral(t) or t.startswith("f8"):
      items.append(f"quantize:{t}")
    elif t == anchor_buf.dtype or t in written:
      if t != anchor_buf.dtype:
        items.append(f"cast:{t}")
    elif not dtypes.is_widening(anchor_buf.dtype, t):
      items.append(f"round:{t}")
  if items and all(w.startswith("round:") for w in items):
    # A reader that only rounds (f32 -> bf16 -> f32, nothing else) is the
    # dtype round trip the copy and prologue rules judge, as a cast.
    items = [f"cast:{w.partition(':')[2]}" for w in items]
  if _gated_product(comp, chain, anchor_param):
    # act(gate) * up from two parts of one result: a GLU's gate/up gemm.
    items = ["glu", "multiply:halves"] + [w for w in items if w != "product"]
  elif not any(w.startswith("activation:") for w in items):
    derivative = _activation_derivative(comp, chain, anchor_param, anchor_buf)
    if derivative:
      # g * act'(z): the backward of a dense layer's activation, reading the
      # saved pre-activation (cuBLASLt's DGELU epilogue); the constants and
      # products are the derivative's, not a scale's.
      items = [f"activation_grad:{derivative}"] + [
          w for w in items if w.startswith(("cast:", "round:", "transpose"))]
  return tuple(dict.fromkeys(items)) or ("elementwise",)


#: Activations whose derivative a factor's own primitives name (erf, tanh
#: and a cube, tanh, a sigmoid).
_DERIVATIVES = frozenset({"gelu", "gelu_tanh", "tanh", "sigmoid", "silu"})

#: Chain ops through which the result stays linear in the anchor's value.
_LINEAR_UNARY = frozenset({"bitcast", "reshape", "copy", "convert", "negate", "transpose"})


def _activation_derivative(comp: Computation, chain: list[Instruction],
                           anchor_param: str, anchor_buf: Buffer) -> str | None:
  """The activation whose derivative the chain multiplies the anchor's value
  by (out = g * act'(z), z a full-size operand read from elsewhere: the
  pre-activation the forward pass saved), or None. The chain must stay
  linear in g: products with values computed apart from g, sums and
  negations of such terms, moves and casts; an add of anything else (a bias,
  a residual) or a select (a mask) is other work. The factor must read a
  full-size array and compute an activation's primitives: a product with a
  saved array alone (a dropout mask) names none."""
  if not anchor_param or anchor_param not in comp or not chain:
    return None
  linear = {anchor_param} | {i.name for i in chain}
  factors: list[str] = []
  for i in chain:
    ins = [o for o in i.operands if o in linear]
    if i.opcode in _LINEAR_UNARY and len(i.operands) == 1:
      continue
    if i.opcode in ("add", "subtract") and len(ins) == 2:
      continue
    if i.opcode in ("multiply", "divide") and len(ins) == 1 and (
        i.opcode == "multiply" or i.operands[0] in linear):
      factors += [o for o in i.operands if o not in linear]
      continue
    return None
  # The factor: everything its operands are computed from, outside the chain.
  seen: dict[str, Instruction] = {}
  stack = [o for o in factors if o in comp]
  while stack:
    name = stack.pop()
    if name in seen or name in linear:
      continue
    inst = seen[name] = comp.instruction(name)
    stack += [o for o in inst.operands if o in comp]
  size = product(anchor_buf.dims)
  if not any(i.opcode == "parameter" and i.shape is not None and i.shape.is_array and
             i.shape.num_elements == size for i in seen.values()):
    return None
  insts = [i for i in comp.instructions if i.name in seen]
  act = activation_of({primitive(i) for i in insts}, {i.opcode for i in insts}, comp, insts)
  if act not in _DERIVATIVES:
    # A relu's derivative is a mask (a select), never a product: a maximum
    # in the factor recomputes a forward value (softplus' max(z, 0) inside
    # exp(z - softplus(z))), which names no derivative.
    return None
  if act in ("sigmoid", "silu"):
    # silu' = s + z * s * (1 - s) multiplies the pre-activation z itself;
    # sigmoid' = s * (1 - s) reads z only through s. (The forward's test, a
    # product of z and s, holds for neither derivative.)
    # The chain's own products count: g * z is one of silu's terms.
    found = sigmoid_input(comp, insts)
    z = found[0] if found else ""
    products = [i for i in insts + list(chain) if i.opcode == "multiply"]
    act = "silu" if z and any(
        z in {name_through(comp, o, VALUE_OPS) for o in i.operands} for i in products
    ) else "sigmoid"
  return act


def _written_types(chain: list[Instruction]) -> set[str]:
  """Element types of the values the chain ends in (those no other chain
  instruction reads; a tuple's elements)."""
  used = {o for i in chain for o in i.operands}
  by_name = {i.name: i for i in chain}
  ends = [i for i in chain if i.name not in used]
  ends = [by_name.get(o) for e in ends for o in e.operands] if all(
      e.opcode == "tuple" for e in ends) and ends else ends
  return {e.shape.element_type for e in ends
          if e is not None and e.shape is not None and e.shape.is_array}


def _gated_product(comp: Computation, chain: list[Instruction], anchor_param: str) -> bool:
  """Whether the chain multiplies values computed from two disjoint slices of
  the anchor's result (silu(x[:, :F]) * x[:, F:]): a GLU's gate and up
  projections computed as one gemm."""
  if not anchor_param or anchor_param not in comp:
    return False

  def of_anchor(name: str) -> bool:  # (through a bitcast: [M, 2F] as [B, T, 2F])
    inst = through_bitcasts(comp, name)
    return inst is not None and inst.name == anchor_param

  halves = [i for i in chain if i.opcode == "slice" and i.operands and of_anchor(i.operands[0])]
  # The halves split the array they slice: the result, or a bitcast of it.
  whole = comp.instruction(halves[0].operands[0]).shape if halves else None
  if len({h.operands[0] for h in halves}) > 1:
    return False
  # Two halves of the last axis: an LSTM's four gates, also multiplied
  # slice by slice, are no GLU.
  if whole is None or not whole.is_array or not whole.dims or len(halves) != 2 or any(
      h.shape is None or not h.shape.is_array or
      tuple(h.shape.dims) != tuple(whole.dims[:-1]) + (whole.dims[-1] // 2,)
      for h in halves):
    return False
  return _multiplies_apart(comp, lambda i: i in halves)


def _multiplies_apart(comp: Computation, is_source, one_side: str = "") -> bool:
  """Whether `comp` multiplies a value computed from some sources (the
  instructions `is_source` picks) by one computed from others alone; with
  `one_side`, a source one side must come from."""
  origin: dict[str, frozenset[str]] = {}
  for i in comp.instructions:  # operands first
    if is_source(i):
      origin[i.name] = frozenset({i.name})
    else:
      origin[i.name] = frozenset().union(*(origin.get(o, frozenset()) for o in i.operands))
    if i.opcode == "multiply" and len(i.operands) == 2:
      a, b = (origin.get(o, frozenset()) for o in i.operands)
      if a and b and not a & b and (not one_side or one_side in a | b):
        return True
  return False


def _glu_activation(program: Program, consumer: Kernel, work: tuple[str, ...]
                    ) -> tuple[str, ...]:
  """The gate's activation, for the up projection's finding too (the GLU
  kernel applies it to the gate either way); () when `work` names it."""
  fused = fused_computation(program, consumer)
  if fused is None or any(w.startswith("activation:") for w in work):
    return ()
  insts = list(fused.instructions)
  act = activation_of({primitive(i) for i in insts}, {i.opcode for i in insts}, fused, insts)
  return (f"activation:{act}",) if act else ()


def _glu_partner(program: Program, k: Kernel, consumer: Kernel, operand: int) -> bool:
  """Whether `consumer` multiplies (a function of) `k`'s result by (a
  function of) another gemm's result computed from the same input: a GLU's
  gate and up projections as two gemms (silu(x @ w_gate) * (x @ w_up))."""
  fused = fused_computation(program, consumer)
  if fused is None:
    return False
  mine = {p for ps in operand_producers(program, k) for p in ps}
  producers = operand_producers(program, consumer)
  partners = {
      j for j, ps in enumerate(producers) if j != operand and any(
          p != k.name and anchor_of(program, program.kernels[p]) == "dot" and
          mine & {q for qs in operand_producers(program, program.kernels[p]) for q in qs}
          for p in ps)}
  if not partners:
    return False
  params = {p.parameter_number: p.name for p in fused.parameters}
  if operand not in params:
    return False
  sources = {params[j] for j in {operand} | partners if j in params}
  return _multiplies_apart(fused, lambda i: i.name in sources, one_side=params[operand])


def _through_converts(comp: Computation, inst: Instruction) -> Instruction:
  """The value behind `inst` through dtype and shape-only changes (a
  residual passed as [b, 1, d] and rounded to bf16 is still the residual)."""
  while inst.opcode in ("convert", "bitcast", "reshape") and inst.operands and \
      inst.operands[0] in comp:
    inst = comp.instruction(inst.operands[0])
  return inst


def _slice_read(program: Program, consumer: Kernel, buf: Buffer,
                whole: bool = True) -> int | None:
  """Bytes `consumer` reads of `buf` when it reads it only through slices
  (possibly after elementwise work on the whole, e.g. a gate fusion adding
  the bias before splitting the gates) and, with `whole`, does same-index
  work on each slice, else None."""
  operand = operand_number(program, consumer, buf)
  fused = fused_computation(program, consumer)
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
        # What the reader does with the slice must be same-index work too:
        # a slice squared and summed (a global norm over a fused QKV
        # gradient's parts) needs the whole slice first.
        if whole and not _elementwise_after(fused, users, u.name):
          return None
      elif u.opcode == "bitcast" or (u.opcode in opcodes.ELEMENTWISE and
                                     u.shape is not None and u.shape.dims == buf.dims):
        stack.append(u.name)
      else:
        return None
  return total


def _elementwise_after(fused: Computation, users: Mapping[str, list[Instruction]],
                       name: str) -> bool:
  """Whether everything computed from `name` in `fused` is elementwise or
  shape-only work (no reduce, gather or matmul)."""
  stack, seen = [name], set()
  while stack:
    for u in users.get(stack.pop(), ()):
      if u.name in seen:
        continue
      seen.add(u.name)
      if not (u.opcode in opcodes.ELEMENTWISE or u.opcode in (
          "bitcast", "reshape", "tuple", "transpose", "slice", "broadcast")):
        return False
      stack.append(u.name)
  return True


def _store_into_slice(program: Program, consumer: Kernel, buf: Buffer) -> bool:
  """Whether `consumer` only copies `buf` into a slice of another buffer
  (a dynamic-update-slice whose update is `buf`): the anchor could store
  there directly."""
  inst = program.inst(consumer)
  operand = operand_number(program, consumer, buf)
  if operand is None:
    return False
  if inst.opcode == "dynamic-update-slice":
    return operand == 1
  fused = fused_computation(program, consumer)
  if fused is None:
    return False
  root = fused.root
  while root.opcode == "bitcast" and root.operands:
    root = fused.instruction(root.operands[0])
  if root.opcode == "pad" and root.operands:
    # Copied into a zero-padded buffer: the anchor could store into it.
    src = through_bitcasts(fused, root.operands[0])
    return src is not None and src.opcode == "parameter" and \
        src.parameter_number == operand
  if root.opcode != "dynamic-update-slice" or len(root.operands) < 2:
    return False
  update = through_bitcasts(fused, root.operands[1])
  return update is not None and update.opcode == "parameter" and \
      update.parameter_number == operand


def _multi_epilogue(program: Program, k: Kernel, anchor: str, buf: Buffer,
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
    operand = operand_number(program, c, buf)
    work = _epilogue_work(program, c, operand, buf) if operand is not None else None
    if work is None and operand is not None:
      # silu(x[:, :F]) * x[:, F:]: a GLU reads its gemm through two slices.
      glu = _epilogue_work(program, c, operand, buf, slices=True)
      work = glu if glu is not None and "glu" in glu else None
    sliced = _slice_read(program, c, buf) if work is None else None
    if work is None and sliced is None:
      if _slice_read(program, c, buf, whole=False) is not None and \
          _depends_on(program, c, k.name, operand):
        later.append(c)  # slices it with values computed from the whole result
        continue
      return None  # another matmul, a reduction: reuse the stored result
    if _depends_on(program, c, k.name, operand):
      later.append(c)  # elementwise, but with values computed from the result
      continue
    fused.append(c)
    works.append(work if work is not None else ("slice",))
    read += buf.bytes if work is not None else sliced
  if not fused or (len(fused) == 1 and not later):
    return None
  n = len(fused)
  stored = bool(later)
  accumulate = False
  if all(w == ("slice",) for w in works) and read <= buf.bytes and not stored:
    ops: tuple[str, ...] = (f"split:{n}",)
    what = (f"{n} kernels ({', '.join(c.name for c in fused)}) each read a "
            "disjoint slice of it (column blocks)")
    accumulate = all(_accumulates_slice(program, c, buf) for c in fused)
    if accumulate:
      what += (" and add it into an array of its own (per-parameter gradient "
               "accumulators of one product)")
  else:
    items = dict.fromkeys(w for work in works for w in _applied(work)
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
  if accumulate:
    return _split_accumulate(k, anchor, buf, fused, ops, saved, what,
                             fuses_addend=program.platform == "gpu")
  return FusionDecisionRecord(
      kind=FindingKind.UNFUSED_EPILOGUE, producer=k.name,
      consumers=tuple(c.name for c in consumers), boundary=buf.name,
      boundary_shape=buf.shape, bytes_saved=times(saved, k.trip_count),
      launches_removed=times(n, k.trip_count),
      extra_arithmetic=f"the {n} readers' elementwise work moves into the matmul's store",
      extra_resources=f"{n} output tiles per accumulator tile",
      numerical_class=NumericalClass.SAME_OPS,
      guard="no kernel yet: no kernel writes several outputs",
      layout_effect=f"the {anchor} writes {n} outputs instead of one",
      evidence=f"{kernel_desc(k)} writes its {anchor} result {buf.shape}; {what}",
      verdict=Verdict.SAFE,
      reasons=("current element only: each output element depends on one "
               "accumulator element",),
      risks=("register count: several epilogues' live values per tile",
             "store coalescing: each output's store must stay vectorized",
             "cache reuse: the readers no longer share one stored result") + COMMON_RISKS,
      ops=ops, kernel=None, trip_count=k.trip_count, source=buf.source,
      computation=k.computation, boundary_kept=stored,
      need=_need(anchor, ops))


def _accumulates_slice(program: Program, consumer: Kernel, buf: Buffer) -> bool:
  """Whether `consumer` only adds one slice of `buf` into another array of
  the slice's shape (`acc + result[:, block]`: a gradient accumulated per
  parameter, each parameter one column block of the product)."""
  operand = operand_number(program, consumer, buf)
  fused = fused_computation(program, consumer)
  if operand is None or fused is None:
    return False
  root = through_bitcasts(fused, fused.root.name)
  if root is None or root.opcode != "add" or len(root.operands) != 2:
    return False
  sides = [through_bitcasts(fused, o) for o in root.operands]
  if any(s is None for s in sides):
    return False
  sliced = [s for s in sides if s.opcode == "slice" and s.operands]
  if len(sliced) != 1:
    return False
  source = through_bitcasts(fused, sliced[0].operands[0])
  other = next(s for s in sides if s is not sliced[0])
  return (source is not None and source.opcode == "parameter" and
          source.parameter_number == operand and other.opcode == "parameter" and
          other.shape is not None and
          sliced[0].shape is not None and
          product(other.shape.dims) == product(sliced[0].shape.dims))


def _split_accumulate(k: Kernel, anchor: str, buf: Buffer, readers: list[Kernel],
                      ops: tuple[str, ...], saved: int, what: str, *,
                      fuses_addend: bool) -> FusionDecisionRecord:
  """A product whose column blocks are each added into an array of their
  own: the parameters of those arrays (an LSTM cell's per-gate weights,
  whose gradients the scan accumulates) kept as one array make one
  accumulator. XLA:GPU adds it in the gemm's epilogue (`fuses_addend`;
  measured on flax's LSTM compiled for an H200: the split and its adds
  gone); XLA:CPU keeps the one add apart, a residual epilogue. A program
  change, not a kernel: no matmul writes N accumulators."""
  n = len(readers)
  then = ("which XLA:GPU fuses into the gemm" if fuses_addend else
          "a residual epilogue of the matmul (XLA:GPU fuses it into the gemm; this "
          "backend keeps it a kernel of its own)")
  return FusionDecisionRecord(
      kind=FindingKind.UNFUSED_EPILOGUE, producer=k.name,
      consumers=tuple(c.name for c in readers), boundary=buf.name,
      boundary_shape=buf.shape, bytes_saved=times(saved, k.trip_count),
      launches_removed=times(n, k.trip_count),
      extra_arithmetic="none: one add in the matmul's store instead of n",
      extra_resources="one accumulator tile read in the epilogue",
      numerical_class=NumericalClass.SAME_OPS,
      guard=(f"n/a: a change to the program: keep the {n} arrays its column blocks "
             f"accumulate into as one {buf.shape} array (one parameter for the "
             "blocks, e.g. an LSTM cell's gates' weights side by side), so one "
             f"add reads the product, {then}"),
      layout_effect=f"the {n} accumulators become one array of the product's shape",
      evidence=f"{kernel_desc(k)} writes its {anchor} result {buf.shape}; {what}",
      verdict=Verdict.SAFE,
      reasons=("current element only: each accumulator element adds one product element",),
      risks=("the parameters' structure changes: checkpoints and optimizer state "
             "keep the new layout",) + COMMON_RISKS,
      ops=ops, kernel=None, trip_count=k.trip_count, source=buf.source,
      computation=k.computation, boundary_kept=False, need=None)


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
