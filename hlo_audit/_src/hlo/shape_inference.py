"""Result shapes for instructions whose text omits them.

XLA lets hand-written HLO leave out shapes it can infer (`x = add(a, b)`).
Optimized dumps always print them, so this covers the common hand-written
cases; anything else is left as None, which the IR documents.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hlo_audit._src.hlo import attributes, opcodes
from hlo_audit._src.hlo.ir import Shape

_PRED_RESULT = frozenset({"compare", "is-finite"})


def infer(opcode: str, operands: Sequence[Shape | None],
          attrs: Mapping[str, str],
          computation_root: Callable[[str], Shape | None]) -> Shape | None:
  """The result shape of `opcode` applied to `operands`, or None.

  Args:
    opcode: the instruction's opcode.
    operands: operand shapes (None where unknown).
    attrs: raw attribute text by name.
    computation_root: root shape of a computation by name (for call/while).
  """
  if any(s is None for s in operands):
    return None
  ops: list[Shape] = list(operands)  # type: ignore[arg-type]
  try:
    if opcode == "tuple":
      return Shape("tuple", tuple_shapes=tuple(ops))
    if opcode == "after-all":
      return Shape("token")
    if opcode in ("partition-id", "replica-id"):
      return Shape("u32")
    if opcode == "get-tuple-element" and ops:
      return ops[0].tuple_shapes[attributes.integer(attrs["index"])]
    if opcode in _PRED_RESULT and ops:
      return Shape("pred", ops[0].dims, ops[0].dynamic_dims)
    if opcode == "select" and len(ops) == 3:
      return _no_layout(ops[1])
    if opcode == "clamp" and len(ops) == 3:
      return _no_layout(ops[1])
    if (opcode in opcodes.ELEMENTWISE or opcode in ("copy", "opt-barrier",
                                                    "add-dependency")) and ops:
      return _no_layout(max(ops, key=lambda s: s.rank))
    if opcode == "broadcast" and ops:
      return None  # needs the result dims, which only the text gives
    if opcode == "transpose" and ops:
      perm = attributes.int_list(attrs["dimensions"])
      return Shape(ops[0].element_type, tuple(ops[0].dims[p] for p in perm))
    if opcode == "reverse" and ops:
      return _no_layout(ops[0])
    if opcode == "concatenate" and ops:
      (dim,) = attributes.int_list(attrs["dimensions"])
      dims = list(ops[0].dims)
      dims[dim] = sum(s.dims[dim] for s in ops)
      return Shape(ops[0].element_type, tuple(dims))
    if opcode == "dot" and len(ops) >= 2:
      return _dot(ops[0], ops[1], attrs)
    if opcode in ("call", "while", "conditional"):
      role = {"call": "to_apply", "while": "body"}.get(opcode)
      if role is None:
        role = ("branch_computations" if "branch_computations" in attrs
                else "true_computation")
      names = attributes.computation_list(attrs[role])
      return computation_root(names[0]) if names else None
    if opcode == "reduce" and ops:
      dims = set(attributes.int_list(attrs["dimensions"]))
      n = len(ops) // 2
      results = [Shape(s.element_type, tuple(d for i, d in enumerate(s.dims)
                                             if i not in dims)) for s in ops[:n]]
      return results[0] if n == 1 else Shape("tuple", tuple_shapes=tuple(results))
  except (KeyError, IndexError, ValueError):
    return None
  return None


def _no_layout(s: Shape) -> Shape:
  return Shape(s.element_type, s.dims, s.dynamic_dims, s.tuple_shapes)


def _dot(lhs: Shape, rhs: Shape, attrs: Mapping[str, str]) -> Shape:
  def dims(key):
    return attributes.int_list(attrs[key]) if key in attrs else ()
  lb, rb = dims("lhs_batch_dims"), dims("rhs_batch_dims")
  lc, rc = dims("lhs_contracting_dims"), dims("rhs_contracting_dims")
  out = [lhs.dims[d] for d in lb]
  out += [d for i, d in enumerate(lhs.dims) if i not in lb and i not in lc]
  out += [d for i, d in enumerate(rhs.dims) if i not in rb and i not in rc]
  return Shape(lhs.element_type, tuple(out))
