"""Physical layouts: whether an instruction really moves data in memory.

A copy or transpose whose result has the same physical element order as its
operand (only size-1 dimensions move, or the layout absorbs the logical
permutation) is a bitcast in all but name; a fusion that only converts dtype
and bitcasts permutes nothing. Only a real permutation is a layout change.
"""

from __future__ import annotations

import numpy as np

from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, Shape

#: What a kernel that cuts a part out of its operand and moves it may do.
_CUT_OPS = frozenset({"slice", "bitcast", "reshape", "transpose", "copy", "convert"})
#: The most elements `cut_reorders` follows one by one.
_MAX_TRACED = 1 << 22


def _physical_order(shape: Shape, perm: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
  """Logical dimensions major-to-minor, size-1 dims dropped, mapped through
  `perm` (result dim -> operand dim); None without a layout."""
  if shape.layout is None or not shape.is_array:
    return None
  m2m = tuple(shape.layout.minor_to_major)
  if len(m2m) != len(shape.dims):
    return None
  order = [d for d in reversed(m2m) if shape.dims[d] != 1]
  if perm is not None:
    order = [perm[d] for d in order]
  return tuple(order)


def permutes(comp: Computation, inst: Instruction) -> bool:
  """Whether a copy or transpose changes the physical element order."""
  if inst.opcode not in ("copy", "transpose") or not inst.operands or \
      inst.operands[0] not in comp or inst.shape is None:
    return False
  src = comp.instruction(inst.operands[0]).shape
  if src is None or not src.is_array or src.dims == () or inst.shape.dims == ():
    return False
  if inst.shape.layout is not None and inst.shape.layout.tiles != (
      src.layout.tiles if src.layout is not None else ()):
    return True  # a tiling change is a physical change (TPU)
  perm = tuple(inst.dimensions or ()) if inst.opcode == "transpose" else None
  if inst.opcode == "transpose" and len(perm) != len(inst.shape.dims):
    return True
  before = _physical_order(src)
  after = _physical_order(inst.shape, perm)
  if before is None or after is None:
    # No layouts printed: a transpose of non-degenerate dims permutes.
    if inst.opcode == "copy":
      return False
    live = [d for d in perm if src.dims[d] != 1]
    return live != sorted(live)
  return before != after


def kernel_permutes(module: HloModule, comp: Computation, inst: Instruction) -> bool:
  """Whether a kernel (a copy, a transpose, or a fusion of them) moves
  elements to a new physical order somewhere."""
  if inst.opcode in ("copy", "transpose"):
    return permutes(comp, inst)
  if inst.opcode != "fusion":
    return False
  calls = inst.called_computations.get("calls", ())
  if not calls or calls[0] not in module:
    return False
  fused = module.computation(calls[0])
  return any(permutes(fused, i) for i in fused.instructions
             if i.opcode in ("copy", "transpose"))


def cut_reorders(module: HloModule, inst: Instruction) -> bool:
  """Whether a fusion that cuts a static part out of its one operand and
  moves it (slices, bitcasts, reshapes, transposes, copies, conversions in
  a chain) writes the part's elements in an order other than the one they
  have in the operand's memory. Follows each element's offset, so that a
  transpose only a strided or contiguous cut survives of (the last step of
  a time-major array, read batch-major, is one contiguous row) reorders
  nothing. False where it cannot tell (tiled layouts, beyond
  `_MAX_TRACED` elements)."""
  calls = inst.called_computations.get("calls", ()) if inst.opcode == "fusion" else ()
  if not calls or calls[0] not in module:
    return False
  fused = module.computation(calls[0])
  chain, cur = [], fused.root
  while cur.opcode != "parameter":
    if cur.opcode not in _CUT_OPS or len(cur.operands) != 1 or cur.operands[0] not in fused:
      return False
    chain.append(cur)
    cur = fused.instruction(cur.operands[0])
  shapes = [cur.shape] + [i.shape for i in chain]
  if not any(i.opcode == "slice" for i in chain) or any(
      s is None or not s.is_array or s.layout is not None and s.layout.tiles
      for s in shapes) or cur.shape.num_elements > _MAX_TRACED:
    return False
  offsets = _from_memory(np.arange(cur.shape.num_elements), cur.shape)
  prev = cur.shape
  for i in reversed(chain):
    if i.opcode == "slice":
      offsets = offsets[tuple(slice(d.start, d.limit, d.stride) for d in i.slices)]
    elif i.opcode == "transpose":
      offsets = offsets.transpose(i.dimensions)
    elif i.opcode == "reshape":
      offsets = offsets.reshape(i.shape.dims)
    elif i.opcode == "bitcast":
      offsets = _from_memory(_to_memory(offsets, prev), i.shape)
    prev = i.shape  # a copy or a conversion keeps each element where it is logically
  return bool(np.any(np.diff(_to_memory(offsets, fused.root.shape)) < 0))


def _major_to_minor(shape: Shape) -> list[int]:
  if shape.layout is None:
    return list(range(len(shape.dims)))
  return list(reversed(shape.layout.minor_to_major))


def _from_memory(flat: np.ndarray, shape: Shape) -> np.ndarray:
  """Values in `shape`'s memory order -> the logical array."""
  major = _major_to_minor(shape)
  return flat.reshape([shape.dims[d] for d in major]).transpose(np.argsort(major))


def _to_memory(logical: np.ndarray, shape: Shape) -> np.ndarray:
  """The logical array -> its values in `shape`'s memory order."""
  return logical.transpose(_major_to_minor(shape)).ravel()
