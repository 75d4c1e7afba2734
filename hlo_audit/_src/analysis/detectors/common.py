"""What the detectors share: anchors, fused computations, operands, descriptions.

Each detector module reads the program through these: which kernels are
matmul anchors (memoized: every reader asks), the computation a fusion runs
and the JAX primitives in it, which operand of a kernel a buffer is and
which kernels wrote each operand, walks through data movement, the
activations elementwise work computes, and how a kernel is named in the
evidence.
"""

from __future__ import annotations

from collections.abc import Sequence

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import Buffer
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.hlo import opcodes
from hlo_audit._src.hlo.ir import Computation, Instruction, op_names

#: Risks every fusion carries.
COMMON_RISKS = ("compile time: a larger kernel compiles slower",
                "debuggability: one fused kernel is harder to inspect")


def times(n: int, trip: int | None) -> int:
  """`n` per run of a kernel that runs `trip` times (None: once)."""
  return n * (trip if trip is not None else 1)


def consumer_kernels(program: Program, buf: Buffer) -> list[Kernel]:
  """The kernels that read `buf`."""
  return [program.kernels[c] for c in buf.consumers if c in program.kernels]


def anchor_of(program: Program, k: Kernel) -> str | None:
  """"dot" or "convolution" when the kernel is a matrix-multiply anchor."""
  try:
    return program.tables.anchors[k.name]
  except KeyError:
    found = program.tables.anchors[k.name] = _find_anchor(program, k)
    return found


def _find_anchor(program: Program, k: Kernel) -> str | None:
  inst = program.inst(k)
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
    if split_k_site(program, k) is not None:
      return "dot"  # it sums a gemm's split-K partial sums: it finishes the dot
  return None


def split_k_site(program: Program, k: Kernel) -> Instruction | None:
  """The reduce summing a Triton gemm's split-K partial sums (f32[k,M,N]
  over dimension 0), when kernel `k` runs one."""
  if "reduce" not in k.fused_ops:
    return None
  try:
    return program.tables.split_k[k.name]
  except KeyError:  # (asked of every reduction kernel, and of anchors)
    fused = fused_computation(program, k)
    found = program.tables.split_k[k.name] = None if fused is None else next(
        (i for i in fused.instructions if i.opcode == "reduce" and bt.is_split_k_reduce(i)),
        None)
    return found


def primitive(inst: Instruction) -> str:
  """The JAX primitive behind an instruction (from op_name), else opcode."""
  return inst.op_name.rpartition("/")[2] or inst.opcode


def primitives(program: Program, k: Kernel) -> frozenset[str]:
  """JAX primitives (or opcodes) a kernel runs, fused ones included."""
  found = program.tables.primitives.get(k.name)
  if found is None:
    fused = fused_computation(program, k)
    insts = fused.instructions if fused is not None else (program.inst(k),)
    found = program.tables.primitives[k.name] = _primitive_names(insts)
  return found


def _primitive_names(insts: Sequence[Instruction]) -> frozenset[str]:
  """`primitive` of each of `insts` (op names read in one pass)."""
  return frozenset(name.rpartition("/")[2] or inst.opcode
                   for name, inst in zip(op_names(insts), insts))


def fused_computation(program: Program, k: Kernel) -> Computation | None:
  """The computation fusion kernel `k` runs (None for other kernels)."""
  try:
    return program.tables.fused[k.name]
  except KeyError:  # (every rule asks, of every kernel it looks at)
    inst = program.inst(k)
    calls = inst.called_computations.get("calls", ()) if inst.opcode == "fusion" else ()
    found = program.tables.fused[k.name] = (
        program.module.computation(calls[0])
        if calls and calls[0] in program.module else None)
    return found


def operand_number(program: Program, consumer: Kernel, buf: Buffer) -> int | None:
  """Which operand of `consumer` holds `buf` (None: none does)."""
  inst = program.inst(consumer)
  for k, operand in enumerate(inst.operands):
    for idx, vid in program.dataflow.holds.get(operand, ()):
      if vid == (buf.instruction, buf.index):
        return k
  return None


def operand_producers(program: Program, k: Kernel) -> tuple[tuple[str, ...], ...]:
  """For each operand of `k`, the kernels whose outputs it holds."""
  found = program.tables.inputs.get(k.name)
  if found is None:
    holds, kernels = program.dataflow.holds, program.kernels
    found = program.tables.inputs[k.name] = tuple(
        tuple(vid[0] for _, vid in holds.get(o, ()) if vid[0] in kernels)
        for o in program.inst(k).operands)
  return found


def kernel_desc(k: Kernel) -> str:
  """A kernel as the evidence names it, e.g. "loop fusion fusion.3"."""
  return f"{k.kind.value} {k.name}" + (f" ({k.detail})" if k.detail and k.detail != k.opcode else "")


def through_bitcasts(comp: Computation, name: str) -> Instruction | None:
  """The instruction behind `name`, through bitcasts and reshapes."""
  inst = comp.instruction(name) if name in comp else None
  while inst is not None and inst.opcode in ("bitcast", "reshape") and inst.operands:
    inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  return inst


def through_kernels(program: Program, comp: Computation, name: str,
                    caller: Instruction | None = None, outer: Computation | None = None,
                    also: tuple[str, ...] = ()) -> tuple[Computation, Instruction | None]:
  """The instruction behind `name` in `comp` through bitcasts (and the
  one-operand opcodes in `also`) and kernel boundaries: a fused
  computation's parameter is its caller's operand (`caller`, the fusion
  instruction running `comp`, in `outer`), a fusion's result is its root.
  (computation, instruction); the instruction is None where the trail is
  lost."""
  for _ in range(16):
    inst = through_bitcasts(comp, name)
    if inst is None:
      return comp, None
    if inst.opcode in also and inst.operands:
      name = inst.operands[0]
      continue
    if inst.opcode == "parameter" and caller is not None and outer is not None and \
        (inst.parameter_number or 0) < len(caller.operands):
      comp, name, caller = outer, caller.operands[inst.parameter_number or 0], None
      continue
    if inst.opcode == "fusion" and caller is None:
      calls = inst.called_computations.get("calls", ())
      if not calls or calls[0] not in program.module:
        return comp, inst
      outer, caller = comp, inst
      comp = program.module.computation(calls[0])
      name = comp.root_name
      continue
    return comp, inst
  return comp, None


def through_moves(comp: Computation, name: str) -> Instruction | None:
  """The instruction behind `name`, through reshapes, bitcasts, copies and
  transposes (data movement that keeps values)."""
  inst = comp.instruction(name) if name in comp else None
  while inst is not None and inst.opcode in ("bitcast", "reshape", "copy", "transpose") \
      and inst.operands:
    inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  return inst


def product(dims) -> int:
  """The number of elements of `dims` (a negative dim counts as 0)."""
  n = 1
  for d in dims:
    n *= max(d, 0)
  return n


def activation_of(names: set[str], ops: set[str], comp: Computation,
                  chain: list[Instruction]) -> str | None:
  """The activation elementwise work `chain` of `comp` computes ("gelu",
  "gelu_tanh", "tanh", "sigmoid+tanh", "softplus", "silu", "sigmoid",
  "hard_swish", "hard_sigmoid", "relu6", "relu"), judged
  by its primitive `names` and `ops`; None for none."""
  if names & {"erf", "erfc"} or "erf" in ops:
    return "gelu"
  if "tanh" in names or "tanh" in ops:
    if names & {"integer_pow", "pow"} or _cubes(chain):
      return "gelu_tanh"  # tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))
    if sigmoid_input(comp, chain) is not None:
      return "sigmoid+tanh"  # a recurrent cell's gates (LSTM, GRU)
    return "tanh"
  if (names & {"log1p"} or "log-plus-one" in ops) and (
      names & {"exp", "exponential"} or "exponential" in ops):
    # jax.nn.softplus: max(x, 0) + log1p(exp(-|x|)) -- its maximum is no relu.
    return "softplus"
  sigmoid = sigmoid_input(comp, chain)
  if sigmoid is not None:
    # x * sigmoid(x), the sigmoid often computed in f32 and rounded back.
    gated = any(i.opcode == "multiply" and
                {name_through(comp, o, VALUE_OPS) for o in i.operands} == set(sigmoid)
                for i in chain)
    return "silu" if gated else "sigmoid"
  hard = _hard_activation(comp, chain)
  if hard is not None:
    return hard
  # A relu acts on the data itself: a maximum with zero on a smaller value
  # is a clamp of statistics (a norm's variance, max(E[x^2] - E[x]^2, 0)).
  maxima = [i for i in chain
            if i.opcode == "maximum" and i.shape is not None and i.shape.is_array]
  if not maxima:
    return None
  widest = max(i.shape.num_elements for i in chain if i.opcode in opcodes.ELEMENTWISE
               and i.shape is not None and i.shape.is_array)  # (the maxima among them)
  for i in maxima:
    if i.shape.num_elements == widest:
      for o in i.operands:
        if o in comp and _is_zero(comp, comp.instruction(o)):
          return "relu"
  return None


def _hard_activation(comp: Computation, chain: list[Instruction]) -> str | None:
  """"relu6" for clamp(0, x, 6); "hard_sigmoid" for relu6(x + 3) / 6;
  "hard_swish" when that multiplies x itself (MobileNetV3's activations, as
  jax.nn and keras write them); None for none. As for a relu, the clamp
  acts on the data itself: one of a smaller value (a squeeze-excite gate
  broadcast onto the data) is the gate's, not the kernel's activation."""
  sizes = [i.shape.num_elements for i in chain if i.opcode in opcodes.ELEMENTWISE
           and i.shape is not None and i.shape.is_array]
  widest = max(sizes, default=0)
  for i in chain:
    if i.opcode != "clamp" or len(i.operands) != 3 or \
        not all(o in comp for o in i.operands) or i.shape is None or \
        not i.shape.is_array or i.shape.num_elements != widest:
      continue
    low, x, high = (comp.instruction(o) for o in i.operands)
    if not (_is_zero(comp, low) and _constant(comp, high) == 6.0):
      continue
    if x.opcode != "add" or not any(_constant(comp, comp.instruction(o)) == 3.0
                                     for o in x.operands if o in comp):
      return "relu6"
    base = {name_through(comp, o, VALUE_OPS) for o in x.operands} - {None}
    # hard_sigmoid's value: the clamp, or it times 1/6; times x: a swish.
    gate = {i.name} | {m.name for m in chain if m.opcode in ("multiply", "divide")
                       and i.name in m.operands}
    for m in chain:
      if m.opcode == "multiply" and len(m.operands) == 2 and gate & set(m.operands):
        other = next(o for o in m.operands if o not in gate) \
            if not set(m.operands) <= gate else None
        if other is not None and name_through(comp, other, VALUE_OPS) in base:
          return "hard_swish"
    return "hard_sigmoid"
  return None


def _constant(comp: Computation, inst: Instruction) -> float | None:
  """The value of a scalar constant (or a broadcast of one); None otherwise."""
  while inst.opcode in ("broadcast", "bitcast") and inst.operands and inst.operands[0] in comp:
    inst = comp.instruction(inst.operands[0])
  if inst.opcode != "constant":
    return None
  try:
    return float((inst.literal or "").strip())
  except ValueError:
    return None


def _cubes(chain: list[Instruction]) -> bool:
  """Whether the chain multiplies a value by its own square (x * (x * x))."""
  squares = {i.name: i.operands[0] for i in chain
             if i.opcode == "multiply" and len(i.operands) == 2 and
             i.operands[0] == i.operands[1]}
  return any(i.opcode == "multiply" and len(i.operands) == 2 and
             any(squares.get(a) == b for a, b in (i.operands, i.operands[::-1]))
             for i in chain)


def sigmoid_input(comp: Computation,
                   chain: list[Instruction]) -> tuple[str, str] | None:
  """(x, sigmoid(x)) when the chain computes a sigmoid: `logistic(x)`, or
  JAX's `1 / (1 + exp(-x))` as jax.nn.silu lowers it."""
  def base(name: str) -> Instruction | None:
    name = name_through(comp, name, VALUE_OPS)
    return comp.instruction(name) if name in comp else None

  for i in chain:
    if i.opcode == "logistic" and i.operands:
      return name_through(comp, i.operands[0], VALUE_OPS), i.name
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
          return (name_through(comp, n.operands[0], VALUE_OPS),
                  name_through(comp, i.name, VALUE_OPS))
  return None


#: Ops that pass a value on unchanged but for its shape or precision (JAX
#: computes bf16 activations in f32 and rounds back).
VALUE_OPS = ("bitcast", "reshape", "convert")


def name_through(comp: Computation, name: str, ops: tuple[str, ...]) -> str:
  """The instruction `name` passes on, through `ops` (e.g. converts)."""
  while name in comp:
    inst = comp.instruction(name)
    if inst.opcode not in ops or not inst.operands:
      break
    name = inst.operands[0]
  return name


def _is_zero(comp: Computation, inst: Instruction) -> bool:
  """Whether `inst` is a zero constant (or a broadcast of one)."""
  while inst.opcode in ("broadcast", "bitcast") and inst.operands:
    inst = comp.instruction(inst.operands[0])
  return inst.opcode == "constant" and (inst.literal or "").strip() in ("0", "-0", "0.0")


#: Ops of a kernel that only cuts or joins data...
SLICE_OPS = frozenset({"slice", "dynamic-slice", "concatenate"})
#: ...and what it may run beside them.
SLICE_GLUE = frozenset({"bitcast", "reshape", "copy", "parameter", "constant",
                        "broadcast", "tuple", "convert"})


def scalar_ops(program: Program, k: Kernel) -> set[str]:
  """Opcodes a fusion runs only on scalars (a dynamic-slice's index
  arithmetic, e.g. a reversed scan's `n - 1 - i`)."""
  fused = fused_computation(program, k)
  if fused is None:
    return set()
  ranked = {i.opcode for i in fused.instructions
            if i.shape is not None and i.shape.is_array and i.shape.dims}
  return {i.opcode for i in fused.instructions} - ranked


def one_per_row(program: Program, where: Computation, scatter: Instruction,
                caller: Instruction | None, outer: Computation) -> bool:
  """Whether `scatter` writes one element per update at distinct places:
  its updates hold one element per index tuple, and its indices are a
  concatenate whose iota parts count every row axis of the updates (so no
  two tuples are equal). `caller` runs `where` in `outer`, where it is a
  fused computation."""
  if len(scatter.operands) != 3:
    return False  # (a variadic scatter)
  at, idx = through_kernels(program, where, scatter.operands[1], caller, outer)
  upd = where.instruction(scatter.operands[2]) if scatter.operands[2] in where else None
  if idx is None or upd is None or idx.opcode != "concatenate" or not idx.dimensions or \
      idx.shape is None or upd.shape is None or not idx.shape.is_array:
    return False
  (axis,) = idx.dimensions
  dims = tuple(idx.shape.dims)
  tuples = product(dims) // max(dims[axis], 1)
  if upd.shape.num_elements != tuples:
    return False  # windows of several elements: updates may overlap
  others = tuple(n for a, n in enumerate(dims) if a != axis)
  counted = set()
  for o in idx.operands:
    part = through_bitcasts(at, o)
    if part is not None and part.opcode == "iota" and part.shape is not None and \
        tuple(n for a, n in enumerate(part.shape.dims) if a != axis) == others:
      counted.add(int(part.attribute("iota_dimension") or -1))
  rows = {a for a, n in enumerate(dims) if a != axis and n > 1}
  # (and a part that is no iota: the data index each row scatters to)
  return bool(rows) and rows <= counted and len(counted) < len(idx.operands)
