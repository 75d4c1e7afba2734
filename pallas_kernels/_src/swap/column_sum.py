"""A dense layer's weight and bias gradients as one `matmul` call.

Differentiated, `x @ w + b` computes `dW = x^T @ dy` (a dot contracting the
leading axes of both) and `db = sum(dy, leading axes)`: XLA reads dy twice,
once per kernel, and a separate reduction writes db.
`matmul(x, dy, transpose_x=True, w_column_sum=True)` returns both from one
pass over dy (cuBLASLt's BGRADB epilogue): the kernel sums the dy tiles it
loads. `match_column_sum` anchors at the weight-gradient dot and takes the
sum of the same dy, wherever the program computes it.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap.patterns import Match, Operand, Result
from pallas_kernels._src.swap.program import Lit, Node, Program, Val

OP = "matmul"


def _column_sum(program: Program, dy: Val, lead: tuple[int, ...], taken: set[int]
                ) -> tuple[Node, set[int]] | None:
  """The reduce_sum of `dy` over its axes `lead` (through a float convert
  that only it reads), and the nodes it takes."""
  if isinstance(dy, Lit):
    return None
  for u in program.uses.get(dy, ()):
    node = program.nodes[u]
    nodes = {u}
    if patterns._float_convert(node, program):
      nxt = program.single_use(node.outs[0])
      if nxt is None:
        continue
      nodes.add(nxt.index)
      node = nxt
    if node.prim == "reduce_sum" and not nodes & taken and \
        tuple(node.params["axes"]) == lead:
      return node, nodes
  return None


def match_column_sum(program: Program, dot: Node, taken: set[int]) -> Result:
  """x^T @ dy contracting the leading axes of both, beside dy's sum over
  them: one `matmul(..., w_column_sum=True)` call; None otherwise."""
  if dot.index in taken:
    return None
  (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
  if lb or rb:
    return None
  shapes = [patterns._shape(program, v) for v in dot.ins]
  ranks = [len(s) for s in shapes]
  lead = tuple(range(len(lc)))
  # Both operands [..., D]: every axis but the last contracted, in order.
  if not lc or tuple(lc) != lead or tuple(rc) != lead or ranks != [len(lead) + 1] * 2:
    return None
  for side in (1, 0):  # dy: the operand whose sum the program takes
    dy, x = dot.ins[side], dot.ins[1 - side]
    found = _column_sum(program, dy, lead, taken)
    if found is None:
      continue
    reduce, nodes = found
    if not all(patterns._is_float(program.aval(v).dtype) for v in dot.ins):
      return None
    rows = math.prod(shapes[0][:-1])
    operands = []
    for v, s in ((x, shapes[1 - side]), (dy, shapes[side])):
      operands.append(Operand(v) if len(s) == 2 else Operand(v, "reshape", (rows, s[-1])))
    static = [("out_dtype", jnp.dtype(program.aval(dot.outs[0]).dtype).name),
              ("transpose_x", True), ("w_column_sum", True)]
    if side == 0:
      static.append(("transpose_out", True))  # dy^T @ x: the result transposed
    precision = dot.params.get("precision")
    why = patterns.precision_reason(precision)
    if why:
      return patterns.Rejection(OP, ("column_sum",), why, dot.index)
    if precision is not None:
      static.append(("precision", precision))
    return Match(op=OP, items=("column_sum",),
                 positional=(("x", operands[0]), ("w", operands[1])), keywords=(),
                 static=tuple(static), outputs=(dot.outs[0], reduce.outs[0]),
                 consumed=frozenset({dot.index} | nodes), anchor=dot.index)
  return None
