"""A GLU's gate and up projections as one `glu_matmul` call.

`act(x @ w_gate) * (x @ w_up)` (SwiGLU, GeGLU; either factor first) is two
gemms of the same x, an activation and a product: XLA writes both gemm
results (or one concatenated result) and reads them back for the product.
`match_glu` anchors at either gemm and takes the pair, the activation (as
`patterns`' point probe recognises it) and the product, with float converts
between them.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._src.ops.glu_matmul import reference as glu_reference
from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap.patterns import Match, Operand, Result
from pallas_kernels._src.swap.program import Lit, Node, Program, Val

OP = "glu_matmul"


def _plain(program: Program, dot: Node) -> bool:
  """Whether a dot_general is x @ w: x [..., K] by a 2-D w [K, N]."""
  (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
  xs = patterns._shape(program, dot.ins[0])
  ws = patterns._shape(program, dot.ins[1])
  return (not lb and not rb and len(ws) == 2 and tuple(rc) == (0,) and len(xs) >= 1
          and tuple(lc) == (len(xs) - 1,))


def _through_converts(program: Program, v: Val, consumed: set[int],
                      taken: set[int]) -> Val:
  """`v` after the float converts that are its only use."""
  while True:
    user = program.single_use(v)
    if user is None or user.index in taken or not patterns._float_convert(user, program):
      return v
    consumed.add(user.index)
    v = user.outs[0]


def _back_through_converts(program: Program, v: Val, consumed: set[int]) -> Val:
  while not isinstance(v, Lit):
    node = program.node_of(v)
    if node is None or not patterns._float_convert(node, program):
      return v
    if program.single_use(v) is None:
      return v
    consumed.add(node.index)
    v = node.ins[0]
  return v


def _activation(program: Program, v: Val, taken: set[int]):
  """(activation, its nodes, its output) of the point region after `v`."""
  found = patterns._pointwise(program, v, taken)
  if found is None:
    return None
  op, nodes, out = found
  if op.clamp or op.activation not in glu_reference.ACTIVATIONS:
    return None
  return op.activation, set(nodes), out


def match_glu(program: Program, dot: Node, taken: set[int]) -> Result:
  """act(x @ w_gate) * (x @ w_up), anchored at either gemm; None where the
  dot is not one of such a pair."""
  if dot.index in taken or not _plain(program, dot):
    return None
  consumed: set[int] = {dot.index}
  start = _through_converts(program, dot.outs[0], consumed, taken)
  act = _activation(program, start, taken | consumed)
  if act is not None:  # the anchor is the gate
    activation, nodes, gated = act
    consumed |= nodes
    gated = _through_converts(program, gated, consumed, taken)
    product = program.single_use(gated)
    if product is None or product.prim != "mul" or product.index in taken:
      return None
    other = product.ins[1] if product.ins[0] == gated else product.ins[0]
    up_val = _back_through_converts(program, other, consumed)
    up = program.node_of(up_val)
    gate = dot
  else:  # the anchor is the up projection: the product's other factor is gated
    product = program.single_use(start)
    if product is None or product.prim != "mul" or product.index in taken:
      return None
    other = product.ins[1] if product.ins[0] == start else product.ins[0]
    gated = _back_through_converts(program, other, consumed)
    # Walk back from the gated value to a gemm: its activation region's start.
    gate, activation = _gate_behind(program, gated, taken | consumed, consumed)
    up, up_val = dot, dot.outs[0]
    if gate is None:
      return None
  if up is None or gate is None or up.prim != "dot_general" or up.index in taken or \
      up.index == gate.index or not _plain(program, up) or up.outs[0] != up_val:
    return None
  x = gate.ins[0]
  if up.ins[0] != x or patterns._shape(program, up.ins[1]) != patterns._shape(
      program, gate.ins[1]):
    return None  # not two projections of the same x
  consumed |= {gate.index, up.index, product.index}
  # Nothing else may read what the call no longer writes.
  inner = {o for i in consumed for o in program.nodes[i].outs}
  if any(u not in consumed for v in inner - {product.outs[0]}
         for u in program.uses.get(v, ())) or (inner & program.returned) - {product.outs[0]}:
    return None
  out = _through_converts(program, product.outs[0], consumed, taken)
  dtype = jnp.dtype(program.aval(out).dtype).name
  return Match(op=OP, items=(f"activation:{activation}", "product"),
               positional=(("x", Operand(x)), ("w_gate", Operand(gate.ins[1])),
                           ("w_up", Operand(up.ins[1]))),
               keywords=(), static=(("activation", activation), ("out_dtype", dtype)),
               outputs=(out,), consumed=frozenset(consumed), anchor=dot.index)


def _gate_behind(program: Program, gated: Val, taken: set[int],
                 consumed: set[int]) -> tuple[Node | None, str]:
  """(the gate gemm, its activation) when `gated` is act(gemm) (through
  converts); (None, "") otherwise."""
  frontier = [gated]
  for _ in range(16):  # the activation region's nodes, back to a gemm
    if not frontier:
      break
    v = frontier.pop()
    node = program.node_of(v)
    if node is None:
      continue
    if node.prim == "dot_general" and node.index not in taken and _plain(program, node):
      mine: set[int] = set()
      start = _through_converts(program, node.outs[0], mine, taken)
      act = _activation(program, start, taken | mine | {node.index})
      if act is not None and act[2] == gated:
        consumed |= mine | act[1]
        return node, act[0]
      return None, ""
    frontier.extend(i for i in node.ins if not isinstance(i, Lit))
  return None, ""
