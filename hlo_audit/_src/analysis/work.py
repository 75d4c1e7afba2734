"""The work a kernel does, counted from the HLO: FLOPs by the unit that runs
them, and transcendentals.

- Dots and convolutions run on the matrix unit (tensor cores, the CPU's
  matmul kernels) at their operands' element type: 2 FLOPs per
  multiply-add, i.e. 2 x output elements x contracted elements. A dot asking
  for `highest` precision in f32 runs on the vector unit instead (no TF32).
  Library calls (cuBLAS, cuBLASLt, cuDNN, oneDNN) are counted from the
  dimension numbers in their configs, as XLA's own dots are.
- Elementwise arithmetic is one FLOP per output element; reductions one per
  input element and reducer op; exp, log, tanh, logistic, erf, sin, cos and
  pow count as transcendentals (the special-function unit, or a polynomial
  of a dozen FLOPs); sqrt and rsqrt, one instruction and a refinement on
  every unit, as elementwise arithmetic.
- Data movement (copies, transposes, broadcasts, slices, gathers) does no
  arithmetic: its cost is the bytes, which `kernels.Kernel` counts. Gathers
  and scatters also record their indexed accesses (`IndexedAccess`): a
  device that moves each index's row in blocks, one index at a time (a
  TPU's), prices those apart (`DeviceFacts.index_block`).

Three traits of how a kernel touches memory, read from layouts and configs,
let a backend's quirks be priced where its device facts say they cost:
`strided` (a transpose or copy that moves the minor-most dimension, or a
reduction that reduces the minor-most dimension and another beyond a kept
one), `reduce_elements` (the inputs its reductions read: XLA:CPU's loop
emitter reduces them one at a time) and `parallel` (XLA:CPU split the kernel
over its threads: `outer_dimension_partitions`).

Pallas and other opaque custom calls do what their code does; they count
no FLOPs here (their bytes still count).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping

import numpy as np

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.hlo import attributes, dtypes, opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction

#: Opcodes priced as transcendentals: one special-function result each.
TRANSCENDENTAL = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic",
    "tanh", "erf", "sine", "cosine", "tan", "atan2", "power", "sinh", "cosh",
    "asin", "acos", "asinh", "acosh", "atanh"})

#: Elementwise opcodes that only move or reinterpret bits.
_NO_ARITHMETIC = frozenset({"copy", "bitcast-convert"})

_EMPTY: Mapping[str, int] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True)
class IndexedAccess:
  """A gather's or scatter's accesses of its operand, one per index."""

  #: Indices (a scatter's updates, a gather's slices).
  indices: int
  #: The window one index touches, in elements along the operand's
  #: minor-most dimension, its second-minor one, and the rest together.
  minor: int
  second_minor: int
  rest: int
  element_bytes: int
  #: A scatter's read-modify-write (True) or a gather's read.
  writes: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Work:
  """Arithmetic of one launch of a kernel."""

  #: Element type of the operands -> FLOPs on the matrix unit.
  matrix_flops: Mapping[str, int] = dataclasses.field(default_factory=lambda: _EMPTY)
  #: Elementwise and reduction FLOPs (vector unit), in f32 or wider.
  vector_flops: int = 0
  #: Transcendental results (special-function unit).
  transcendentals: int = 0
  #: Bytes of library scratch space among the results (a cuBLAS workspace),
  #: written by no one: not traffic.
  scratch_bytes: int = 0
  #: Elements its reductions iterate over (a variadic reduce's once).
  reduce_elements: int = 0
  #: The smallest contracted size of its dots and convolutions (0: none).
  narrowest: int = 0
  #: Whether it reads or writes memory out of order (see the module's doc).
  strided: bool = False
  #: Whether the backend splits it over threads (XLA:CPU's partitions).
  parallel: bool = False
  #: How its largest dot reads its operands in memory: "nn" (the left one
  #: contracts its minor dimension, the right one a major one), "nt" (the
  #: right one transposed: it contracts its minor dimension), "tn", "tt";
  #: "" without a dot (libraries run some of these far slower).
  orientation: str = ""
  #: Its gathers' and scatters' per-index accesses of their operands.
  indexed: tuple[IndexedAccess, ...] = ()

  @property
  def flops(self) -> int:
    return sum(self.matrix_flops.values()) + self.vector_flops

  def __add__(self, other: Work) -> Work:
    return total_work((self, other))


def total_work(works) -> Work:
  """The work of several parts together, in one pass (a fusion's body holds
  thousands of instructions in a large program: no Work per partial sum)."""
  matrix: dict[str, int] = {}
  vector = transcendentals = scratch = reduced = 0
  narrow = 0
  strided = parallel = False
  orientation, largest = "", -1
  indexed: list[IndexedAccess] = []
  for w in works:
    if w is NO_WORK:
      continue
    if w.matrix_flops:
      here = 0
      for k, v in w.matrix_flops.items():
        matrix[k] = matrix.get(k, 0) + v
        here += v
      if here > largest and w.orientation:
        orientation, largest = w.orientation, here
    vector += w.vector_flops
    transcendentals += w.transcendentals
    scratch += w.scratch_bytes
    reduced += w.reduce_elements
    if w.narrowest and (not narrow or w.narrowest < narrow):
      narrow = w.narrowest
    strided = strided or w.strided
    parallel = parallel or w.parallel
    indexed.extend(w.indexed)
  return Work(types.MappingProxyType(matrix) if matrix else _EMPTY, vector,
              transcendentals, scratch, reduced, narrow, strided, parallel, orientation,
              tuple(indexed))


NO_WORK = Work()


def kernel_work(module: HloModule, comp: Computation, inst: Instruction,
                members: tuple[str, ...] = (), cache: dict | None = None) -> Work:
  """The work of the kernel `inst` launches (`comp` defines it; `members`:
  a grouped kernel's instructions, e.g. an interpreted Pallas kernel's;
  `cache`: fused computation name -> its work, shared across kernels)."""
  cache = {} if cache is None else cache
  if members:
    parts = []
    for name in members:
      owner = comp if name in comp else _owners(module, cache).get(name)
      if owner is not None:
        parts.append(_op_work(module, owner, owner.instruction(name), cache))
    return total_work(parts)
  work = _op_work(module, comp, inst, cache)
  if _partitioned(inst):
    work = dataclasses.replace(work, parallel=True)
  return work


def _partitioned(inst: Instruction) -> bool:
  """Whether XLA:CPU split the kernel over threads (a non-empty
  `outer_dimension_partitions` in its backend config)."""
  raw = inst.attribute("backend_config")
  if not raw or "outer_dimension_partitions" not in raw:
    return False
  config = inst.backend_config_json() or {}
  return bool(config.get("outer_dimension_partitions"))


#: The `cache` key of the instruction name -> computation index.
_OWNERS = ("owners",)


def _owners(module: HloModule, cache: dict) -> dict[str, Computation]:
  """Instruction name -> the computation holding it, made once per cache (a
  grouped kernel's members sit in its loop bodies)."""
  index = cache.get(_OWNERS)
  if index is None:
    index = cache[_OWNERS] = {i.name: c for c in module.computations for i in c.instructions}
  return index


def _op_work(module: HloModule, comp: Computation, inst: Instruction, cache: dict,
             nested: bool = False) -> Work:
  op = inst.opcode
  if op == "fusion":
    calls = inst.called_computations.get("calls", ())
    if not calls or calls[0] not in module:
      return NO_WORK
    work = computation_work(module, calls[0], cache)
    if nested and work.indexed and _fills_scatter_operand(module, comp, inst, calls[0]):
      # The kernel makes the scatter's operand itself (a fill fused in):
      # XLA:TPU updates it where it made it, with no per-index traffic
      # (libtpu 0.0.42.1 prices such a scatter at its bytes).
      work = dataclasses.replace(work, indexed=tuple(a for a in work.indexed
                                                     if not a.writes))
    return work
  if op == "custom-call":
    return _library_work(comp, inst)
  if op == "async-start":
    callee = inst.called_computation_names()
    if callee and callee[0] in module:
      return computation_work(module, callee[0], cache)
    return NO_WORK
  return _instruction_work(module, comp, inst, cache)


def computation_work(module: HloModule, name: str, cache: dict) -> Work:
  """The work of every instruction of computation `name` (a fusion's body),
  nested fusions included."""
  hit = cache.get(name)
  if hit is not None:
    return hit
  cache[name] = NO_WORK  # a cycle (malformed input) counts nothing twice
  comp = module.computation(name)
  total = cache[name] = total_work(
      _op_work(module, comp, i, cache, nested=True) for i in comp.instructions
      if i.opcode != "parameter")
  return total


def _fills_scatter_operand(module: HloModule, comp: Computation, inst: Instruction,
                           callee: str) -> bool:
  """Whether the nested fusion `inst` roots a scatter whose operand `comp`
  computes (not one of `comp`'s parameters: a buffer the kernel reads)."""
  root = module.computation(callee).root
  if root.opcode != "scatter" or not root.operands:
    return False
  operand = module.computation(callee).instruction(root.operands[0])
  if operand.opcode != "parameter" or operand.parameter_number is None:
    return False
  k = operand.parameter_number
  source = _operand(comp, inst, k)
  return source is not None and source.opcode != "parameter"


def _elements(inst: Instruction) -> int:
  shape = inst.shape
  if shape is None:
    return 0
  if shape.is_tuple:
    return sum(s.num_elements for s in shape.tuple_shapes if s.is_array)
  return shape.num_elements if shape.is_array else 0


def _operand(comp: Computation, inst: Instruction, k: int) -> Instruction | None:
  if k < len(inst.operands) and inst.operands[k] in comp:
    return comp.instruction(inst.operands[k])
  return None


def _reducer_ops(module: HloModule, inst: Instruction) -> int:
  """Arithmetic ops of a reduce's combiner (1 for a plain sum or max)."""
  apply = inst.called_computations.get("to_apply", ())
  if not apply or apply[0] not in module:
    return 1
  n = sum(1 for i in module.computation(apply[0]).instructions
          if i.opcode not in opcodes.NO_COMPUTE)
  return max(n, 1)


def _instruction_work(module: HloModule, comp: Computation, inst: Instruction,
                      cache: dict) -> Work:
  op = inst.opcode
  if op in ("dot", "ragged-dot", "scaled-dot"):
    lhs = _operand(comp, inst, 0)
    dnums = inst.dot_dimension_numbers
    work = _dot_work(inst, lhs, dnums.lhs_contracting,
                     _highest(inst.attribute("operand_precision")))
    if work.matrix_flops:
      work = dataclasses.replace(work, orientation=_orientation(
          lhs, _operand(comp, inst, 1), dnums.lhs_contracting, dnums.rhs_contracting))
    return work
  if op == "convolution":
    return _conv_work(comp, inst)
  if op in ("transpose", "copy"):
    source = _operand(comp, inst, 0)
    if source is not None and _moves_minor(source, inst):
      return Work(strided=True)
    return NO_WORK
  if op in TRANSCENDENTAL:
    return Work(transcendentals=_elements(inst))
  if op in opcodes.ELEMENTWISE:
    return NO_WORK if op in _NO_ARITHMETIC else Work(vector_flops=_elements(inst))
  if op == "reduce":
    n = len(inst.operands) // 2 or 1
    first = _operand(comp, inst, 0)
    inputs = sum(_elements(o) for o in (_operand(comp, inst, k) for k in range(n)) if o)
    return Work(vector_flops=inputs * _reducer_ops(module, inst),
                reduce_elements=_elements(first) if first is not None else 0,
                strided=first is not None and _strided_reduce(first, inst.dimensions or ()))
  if op == "reduce-window":
    size = math.prod(w.size for w in (inst.window or ())) or 1
    return Work(vector_flops=_elements(inst) * size * _reducer_ops(module, inst),
                reduce_elements=_elements(inst) * size)
  if op == "select-and-scatter":
    source = _operand(comp, inst, 0)
    size = math.prod(w.size for w in (inst.window or ())) or 1
    return Work(vector_flops=(_elements(source) if source else 0) * size)
  if op == "scatter":
    updates = _operand(comp, inst, len(inst.operands) - 1)
    access = _scatter_access(comp, inst, updates)
    return Work(vector_flops=_elements(updates) if updates else 0,
                indexed=(access,) if access else ())
  if op == "gather":
    access = _gather_access(comp, inst)
    return Work(indexed=(access,)) if access else NO_WORK
  if op == "sort":
    n = _elements(inst)
    dims = inst.dimensions or ()
    shape = inst.shape.tuple_shapes[0] if inst.shape is not None and inst.shape.is_tuple \
        else inst.shape
    length = shape.dims[dims[0]] if shape is not None and dims and dims[0] < len(shape.dims) \
        else n
    return Work(vector_flops=int(n * max(math.log2(max(length, 2)), 1)))
  if op in ("rng", "rng-bit-generator"):
    return Work(vector_flops=_elements(inst))
  if op in ("map", "call"):
    return total_work(computation_work(module, c, cache)
                      for c in inst.called_computation_names() if c in module)
  return NO_WORK


def _ints(inst: Instruction, key: str) -> tuple[int, ...]:
  """An integer-list attribute (`offset_dims={1,2}`); () where absent."""
  raw = inst.attribute(key)
  return attributes.int_list(raw) if raw else ()


def _window_access(operand: Instruction, window: Mapping[int, int], indices: int,
                   writes: bool) -> IndexedAccess | None:
  """`indices` accesses of `window` (operand dimension -> elements) of
  `operand`, its dimensions named in memory order."""
  shape = operand.shape
  if shape is None or not shape.is_array or indices <= 0:
    return None
  order = (shape.layout.minor_to_major if shape.layout is not None
           and shape.layout.minor_to_major else tuple(reversed(range(len(shape.dims)))))
  sizes = [max(1, window.get(d, 1)) for d in order]
  minor = sizes[0] if sizes else 1
  second = sizes[1] if len(sizes) > 1 else 1
  rest = math.prod(sizes[2:]) if len(sizes) > 2 else 1
  return IndexedAccess(indices=indices, minor=minor, second_minor=second, rest=rest,
                       element_bytes=max(1, dtypes.storage_bits_of(shape.element_type) // 8),
                       writes=writes)


def _tiled_dims(shape, windows: tuple[int, ...]) -> tuple[int, ...]:
  """`shape`'s dimensions, padded to its layout's first tile where indices
  span two or more dimensions and each moves one element (`windows` empty):
  XLA:TPU runs such a gather or scatter once per element of the tiles,
  padding included (libtpu prices an [R, 2] batch of updates as R x 128, a
  flat one of 2R as 2R)."""
  dims = list(shape.dims)
  layout = shape.layout
  if not windows and len(dims) > 1 and layout is not None and layout.tiles \
      and layout.minor_to_major:
    for size, d in zip(reversed(layout.tiles[0].dims), layout.minor_to_major):
      if size > 0:
        dims[d] = -(-dims[d] // size) * size
  return tuple(dims)


def _gather_access(comp: Computation, inst: Instruction) -> IndexedAccess | None:
  """A gather's reads: one window of `slice_sizes` per index."""
  operand, index = _operand(comp, inst, 0), _operand(comp, inst, 1)
  if operand is None or index is None or index.shape is None or not index.shape.is_array:
    return None
  if inst.shape is None or not inst.shape.is_array:
    return None
  offsets = _ints(inst, "offset_dims")
  indices = math.prod(d for k, d in enumerate(_tiled_dims(inst.shape, offsets))
                      if k not in offsets)
  window = dict(enumerate(_ints(inst, "slice_sizes")))
  return _window_access(operand, window, indices, writes=False)


def _scatter_access(comp: Computation, inst: Instruction,
                    updates: Instruction | None) -> IndexedAccess | None:
  """A scatter's read-modify-writes: one update window per index."""
  operand = _operand(comp, inst, 0)
  if operand is None or updates is None or updates.shape is None \
      or not updates.shape.is_array or operand.shape is None:
    return None
  window_dims = _ints(inst, "update_window_dims")
  indices = math.prod(d for k, d in enumerate(_tiled_dims(updates.shape, window_dims))
                      if k not in window_dims)
  skipped = set(_ints(inst, "inserted_window_dims")) | set(_ints(inst, "input_batching_dims"))
  kept = [d for d in range(len(operand.shape.dims)) if d not in skipped]
  window = {d: updates.shape.dims[w] for d, w in zip(kept, window_dims)}
  return _window_access(operand, window, indices, writes=True)


def _minor(inst: Instruction) -> int | None:
  """The minor-most dimension of an array's layout (None: no layout or rank 0)."""
  shape = inst.shape
  if shape is None or not shape.is_array or shape.layout is None or \
      not shape.layout.minor_to_major:
    return None
  return shape.layout.minor_to_major[0]


def _moves_minor(source: Instruction, inst: Instruction) -> bool:
  """Whether a transpose or copy reads its operand's minor-most dimension
  across its result's rows (a physical transpose: strided on one side)."""
  src, dst = _minor(source), _minor(inst)
  if src is None or dst is None:
    return False
  if source.shape.dims[src] == 1 or inst.shape.dims[dst] == 1:
    return False  # a dimension of one moves nothing
  if inst.opcode == "transpose":
    perm = inst.dimensions or ()
    return dst < len(perm) and perm[dst] != src
  return dst != src


def _strided_reduce(source: Instruction, reduced: tuple[int, ...]) -> bool:
  """Whether a reduction reads out of order: in memory order (minor to
  major, dimensions of one aside) it reduces the minor-most dimension and
  again one beyond a kept one. A row reduction (minor dimensions reduced,
  then kept ones) and a column one (kept minor dimensions: vectors summed
  down the reduced ones) both read in order."""
  shape = source.shape
  if shape is None or not shape.is_array or shape.layout is None:
    return False
  order = [d for d in shape.layout.minor_to_major if shape.dims[d] != 1]
  marks = "".join("R" if d in reduced else "K" for d in order)
  return marks.startswith("R") and "KR" in marks


def _orientation(lhs: Instruction | None, rhs: Instruction | None,
                 lhs_contracting, rhs_contracting) -> str:
  """"nn", "nt", "tn" or "tt" (see `Work.orientation`); "" without layouts."""
  a, b = (_minor(lhs) if lhs is not None else None), (_minor(rhs) if rhs is not None else None)
  if a is None or b is None:
    return ""
  return ("n" if a in lhs_contracting else "t") + ("t" if b in rhs_contracting else "n")


def _highest(precision: str | None) -> bool:
  return bool(precision) and "highest" in precision.lower()


def _dot_work(inst: Instruction, lhs: Instruction | None, contracting, highest: bool) -> Work:
  out = _elements(inst) if not (inst.shape is not None and inst.shape.is_tuple) else (
      inst.shape.tuple_shapes[0].num_elements if inst.shape.tuple_shapes else 0)
  if lhs is None or lhs.shape is None or not lhs.shape.is_array:
    return NO_WORK
  k = 1
  for d in contracting:
    if 0 <= d < len(lhs.shape.dims):
      k *= lhs.shape.dims[d]
  flops = 2 * out * k
  element = lhs.shape.element_type
  if highest and element == "f32":
    return Work(vector_flops=flops)  # no TF32: the vector unit's FMAs
  return Work(matrix_flops=types.MappingProxyType({element: flops}), narrowest=k)


def _conv_work(comp: Computation, inst: Instruction) -> Work:
  """2 x output elements x (kernel elements per output feature)."""
  rhs = _operand(comp, inst, 1)
  lhs = _operand(comp, inst, 0)
  shape = inst.shape
  if shape is not None and shape.is_tuple:
    shape = shape.tuple_shapes[0] if shape.tuple_shapes else None
  if rhs is None or rhs.shape is None or shape is None or not rhs.shape.is_array:
    return NO_WORK
  dnums = inst.convolution_dimension_numbers
  out_features = 1
  if dnums is not None and dnums.kernel_output_feature < len(rhs.shape.dims):
    out_features = rhs.shape.dims[dnums.kernel_output_feature]
  elif rhs.shape.dims:
    out_features = rhs.shape.dims[-1]
  per_output = rhs.shape.num_elements // max(out_features, 1)
  # Window positions on padding or between dilated input elements multiply
  # nothing: XLA:TPU writes a batched matmul as a convolution whose batch is
  # a window over an input dilated by its own size (`size=4x8 stride=3x7
  # lhs_dilate=4x8`), where one position in 32 is real.
  real = _real_window_fraction(inst, lhs, dnums)
  flops = round(2 * shape.num_elements * per_output * real)
  element = (lhs.shape.element_type if lhs is not None and lhs.shape is not None
             else rhs.shape.element_type)
  return Work(matrix_flops=types.MappingProxyType({element: flops}),
              narrowest=max(1, round(per_output * real)))


#: Window positions a convolution's padding and holes are counted over, per
#: dimension; beyond it every position counts.
_MAX_WINDOW_PAIRS = 1 << 24


def _real_window_fraction(inst: Instruction, lhs, dnums) -> float:
  """The fraction of (output position, window position) pairs of a
  convolution that read an input element: not padding, nor a hole between
  the elements `lhs_dilate` spreads apart (XLA's own cost analysis counts a
  convolution's FLOPs so). 1.0 when the window, the dimension numbers or
  the input's shape are unknown."""
  window = inst.window
  if not window or dnums is None or lhs is None or lhs.shape is None:
    return 1.0
  if all(w.base_dilation == 1 and w.padding_low <= 0 and w.padding_high <= 0
         for w in window):
    return 1.0  # every position reads an element (negative padding crops)
  out_shape = inst.shape.tuple_shapes[0] if inst.shape.is_tuple else inst.shape
  fraction = 1.0
  for d, w in enumerate(window):
    if d >= len(dnums.output_spatial) or d >= len(dnums.input_spatial):
      return 1.0
    n_in = lhs.shape.dims[dnums.input_spatial[d]]
    n_out = out_shape.dims[dnums.output_spatial[d]]
    if n_out <= 0 or w.size <= 0 or n_out * w.size > _MAX_WINDOW_PAIRS:
      continue
    o = np.arange(n_out) * w.stride - w.padding_low
    real = 0
    for k in range(w.size):
      p = o + k * w.window_dilation
      real += int(np.count_nonzero((p >= 0) & (p % w.base_dilation == 0)
                                   & (p // w.base_dilation < n_in)))
    fraction *= real / (n_out * w.size)
  return fraction


def _library_work(comp: Computation, inst: Instruction) -> Work:
  """A library custom call's work: gemms from their dot dimension numbers,
  convolutions from their dim_labels; a workspace result is scratch."""
  scratch = _workspace_bytes(inst)
  if bt.is_gemm_call(inst):
    config = inst.backend_config_json() or {}
    gemm = config.get("gemm_backend_config") or {}
    dnums = gemm.get("dot_dimension_numbers") or {}
    try:
      contracting = tuple(int(d) for d in dnums.get("lhs_contracting_dimensions", ()))
    except (TypeError, ValueError):
      contracting = ()
    precision = (gemm.get("precision_config") or {}).get("operand_precision") or ()
    highest = any(_highest(str(p)) for p in precision)
    work = _dot_work(inst, _operand(comp, inst, 0), contracting, highest)
  elif bt.is_conv_call(inst):
    work = _conv_work(comp, inst)
  else:
    work = NO_WORK
  return dataclasses.replace(work, scratch_bytes=scratch) if scratch else work


def _workspace_bytes(inst: Instruction) -> int:
  """A library call's scratch result: the last tuple element, a flat u8/s8
  buffer (cuBLAS's workspace, cuDNN's scratch)."""
  if bt.library_of(inst.custom_call_target or "") is None:
    return 0
  shape = inst.shape
  if shape is None or not shape.is_tuple or len(shape.tuple_shapes) < 2:
    return 0
  last = shape.tuple_shapes[-1]
  if last.element_type in ("u8", "s8") and last.rank == 1:
    return last.byte_size
  return 0
