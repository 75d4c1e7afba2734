"""Physical layouts: whether an instruction really moves data in memory.

A copy or transpose whose result has the same physical element order as its
operand (only size-1 dimensions move, or the layout absorbs the logical
permutation) is a bitcast in all but name; a fusion that only converts dtype
and bitcasts permutes nothing. Only a real permutation is a layout change.
"""

from __future__ import annotations

from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, Shape


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
