"""A dense layer's backward through its activation as one `matmul` call.

Differentiated, `act(x @ w1 + b) @ w2` computes `dh = dy @ w2^T` and then
`dz = dh * act'(z)` from the pre-activation z the forward pass computed
(JAX's jvp writes act' as a few products and sums with values derived from
z: GELU's erfc and exp, silu's sigmoid). XLA writes dh and reads it back;
`matmul(dy, w2, transpose_w=True, activation_grad=act, preactivation=z)`
applies the derivative in the gemm's store (cuBLASLt's DGELU epilogue).

`match_activation_grad` anchors at the gemm: the work after it must be
linear in its result (products with values computed from one full-size
value z alone, sums and negations of such terms, moves and float casts),
and replayed on probe points it must equal `g * act'(z)` for one of the
activations the kernel takes.
"""

from __future__ import annotations

import numpy as np

import jax.extend.core as jex_core
import jax.numpy as jnp

from pallas_kernels._src.swap import patterns, probe
from pallas_kernels._src.swap.patterns import Match, Operand, Rejection, Result
from pallas_kernels._src.swap.program import Lit, Node, Program, Val, bind

OP = "matmul"

#: Work through which the result stays linear in the gemm's value: unary
#: moves and casts, and (checked per node) products, quotients and sums.
_LINEAR_UNARY = frozenset({"neg", "copy", "copy_p", "convert_element_type", "reshape",
                           "squeeze", "expand_dims"})
_LINEAR_BINARY = frozenset({"mul", "div", "add", "add_any", "sub"})
#: Elementwise work a factor may compute from z (no shape in its params).
_ELEMENTWISE = _LINEAR_UNARY | _LINEAR_BINARY | frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "erf", "erfc", "tanh", "logistic",
    "integer_pow", "square", "sqrt", "rsqrt", "pow", "max", "min", "abs", "sign",
    "broadcast_in_dim",
    # jax 0.12's tanh derivative (1 - t^2) and polynomial evaluation.
    "one_minus_square", "polynomial"})
#: Calls whose body the factor may hold (jax 0.12 writes GELU's exp(-x^2)
#: as a custom_jvp call), replayed through their body.
_CALLS = frozenset({"custom_jvp_call", "custom_vjp_call", "pjit", "closed_call"})
#: Shape-only prims: the values pass unchanged.
_MOVES = frozenset({"reshape", "squeeze", "expand_dims", "copy", "copy_p"})
#: The smooth activations whose derivative the kernel applies (a relu's is
#: a select, not a product).
_SMOOTH = ("gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
#: Replayed act' agrees with a float64 derivative within this (float32 erfc
#: and exp expansions); tanh-GELU's and exact GELU's derivatives differ by
#: about 1e-3.
_TOL = 2e-5



def _chain(program: Program, start: int, taken: set[int]
           ) -> tuple[list[Node], list[Val], int] | None:
  """(nodes linear in `start`, the outside values they multiply by, the
  value they end in) when the nodes that read `start`, and those reading
  what they compute, stay linear in it until one value that only other
  work reads (the gradient a bias sum and a weight gradient read)."""
  n = program.size(start)
  linear = {start}
  nodes: list[Node] = []
  factors: list[Val] = []
  exits: set[int] = set()
  # In program order, so that a sum sees both of its terms judged.
  last = max(program.uses.get(start, ()), default=-1)
  at = program.producer[start]
  while at < last:
    at += 1
    node = program.nodes[at]
    ins = [i for i in node.ins if not isinstance(i, Lit) and i in linear]
    if not ins:
      continue
    outside = [i for i in node.ins if isinstance(i, Lit) or i not in linear]
    prim = node.prim
    ok = node.index not in taken and len(node.outs) == 1 and \
        program.size(node.outs[0]) == n and (
            (prim in _LINEAR_UNARY and len(node.ins) == 1) or
            (prim in ("add", "add_any", "sub") and len(ins) == 2) or
            (prim == "mul" and len(ins) == 1) or
            (prim == "div" and len(ins) == 1 and node.ins[0] in linear))
    if not ok:
      exits.update(ins)
      continue
    if prim in ("mul", "div"):
      factors += [i for i in outside if not isinstance(i, Lit)]
    nodes.append(node)
    linear.add(node.outs[0])
    last = max([last, *program.uses.get(node.outs[0], ())])
  exits |= linear & program.returned
  read = {i for node in nodes for i in node.ins if not isinstance(i, Lit)}
  if not nodes or len(exits) != 1 or start in exits:
    return None  # No work, or the gemm's own result (or a second value) read elsewhere.
  sink = exits.pop()
  if any(node.outs[0] not in read and node.outs[0] != sink for node in nodes):
    return None  # The value read elsewhere is inside the chain: its end is another.
  return nodes, factors, sink


def _root(program: Program, factors: list[Val], n: int) -> tuple[int, list[Node]] | None:
  """(z, the nodes computing the factors from it): every factor computed
  elementwise from one full-size value z (scalars and literals aside)."""
  roots: set[int] = set()
  nodes: dict[int, Node] = {}
  stack = list(factors)
  while stack:
    v = stack.pop()
    if isinstance(v, Lit) or program.value_of(v) is not None and program.size(v) == 1:
      continue
    node = program.node_of(v)
    full = [i for i in (node.ins if node else ()) if not isinstance(i, Lit)]
    if node is None or node.prim not in _ELEMENTWISE | _CALLS or len(node.outs) != 1 or any(
        program.size(i) not in (1, n) for i in full) or (
        node.prim == "broadcast_in_dim" and program.size(node.ins[0]) != 1):
      if program.size(v) != n:
        return None  # A vector or other operand: a scale, not a derivative.
      roots.add(v)
      continue
    if node.index not in nodes:
      nodes[node.index] = node
      stack.extend(node.ins)
  if len(roots) != 1:
    return None
  return roots.pop(), [nodes[i] for i in sorted(nodes)]


def _replay(program: Program, nodes: list[Node], env: dict) -> dict | None:
  """Evaluates `nodes` on 1-D float32 probe arrays (their work is
  elementwise, so any length does; a broadcast scalar becomes a full probe
  array). Casts pass values unchanged: a bf16 program's roundings would blur
  tanh-GELU's derivative into exact GELU's, and the work is what names it."""
  width = next(iter(env.values())).shape[0]
  for node in nodes:
    vals = []
    for i in node.ins:
      if not isinstance(i, Lit) and i in env:
        vals.append(env[i])
        continue
      value = program.value_of(i)
      if value is None:
        return None
      vals.append(np.asarray(value, np.float32).reshape(()))
    if node.prim in _MOVES or node.prim == "convert_element_type" or (
        node.prim == "broadcast_in_dim" and vals[0].ndim == 0):
      out = np.broadcast_to(np.asarray(vals[0], np.float32), (width,))
    elif node.prim in _CALLS:
      # The body's work binds to probe arrays as to the program's (its
      # equations are elementwise, else replaying them fails: no match).
      body = probe._body(node.eqn)
      if body is None:
        return None
      (out,) = _eval_body(body, [jnp.broadcast_to(jnp.asarray(v, jnp.float32), (width,))
                                 for v in vals])
    else:
      out = bind(node.eqn, [jnp.asarray(v, jnp.float32) for v in vals])
    env[node.outs[0]] = np.asarray(out, np.float32)
  return env


def _eval_body(closed: jex_core.ClosedJaxpr, invals: list) -> list:
  """A call's body bound equation by equation to `invals` (as
  `jax.core.eval_jaxpr` does; nested calls bind whole)."""
  jaxpr = closed.jaxpr
  env: dict = dict(zip(jaxpr.invars, invals))
  env.update(zip(jaxpr.constvars, closed.consts))

  def read(v):
    return v.val if isinstance(v, jex_core.Literal) else env[v]

  for eqn in jaxpr.eqns:
    outs = bind(eqn, [read(v) for v in eqn.invars])
    env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else (outs,)))
  return [read(v) for v in jaxpr.outvars]


def _derivative(name: str, x: np.ndarray) -> np.ndarray:
  """act'(x) in float64, by central differences of the probe's own
  activation table (one definition of each activation)."""
  fn = probe._ACTIVATIONS[name]
  h = 1e-5 * np.maximum(1.0, np.abs(x))
  return (fn(x + h) - fn(x - h)) / (2 * h)


def _classify(program: Program, dot_out: int, z: int, nodes: list[Node],
              sink: int) -> str | None:
  """The activation whose derivative the replayed work multiplies by."""
  zs = probe._POINTS.astype(np.float32)
  g = np.random.default_rng(0).normal(size=zs.shape).astype(np.float32)
  env = {dot_out: g, z: zs}
  try:
    env = _replay(program, nodes, env)
  except Exception:  # noqa: BLE001 - work that does not replay on probes is no match
    return None
  if env is None or sink not in env:
    return None
  y = env[sink]
  x64 = np.asarray(env[z], np.float64)
  g64 = np.asarray(env[dot_out], np.float64)
  # (In float32, but for constants the program wrote in a narrower type.)
  tol = max([_TOL] + [probe._precision(program.aval(i).dtype) for n in nodes
                      for i in n.ins if isinstance(i, Lit)])
  errors = {name: probe._rel_err(y, g64 * _derivative(name, x64)) for name in _SMOOTH}
  closest = min(errors, key=errors.__getitem__)
  return closest if errors[closest] <= tol else None


def match_activation_grad(program: Program, dot: Node, taken: set[int]) -> Result:
  """dot_general, then its result times act'(z): one `matmul` call with
  `activation_grad` and `preactivation=z`; None where the work after the
  dot is anything else."""
  if dot.index in taken:
    return None
  out = dot.outs[0]
  chain = _chain(program, out, taken)
  if chain is None:
    return None
  nodes, factors, sink = chain
  n = program.size(out)
  found = _root(program, factors, n)
  if found is None:
    return None
  z, z_nodes = found
  if not patterns._is_float(program.aval(z).dtype) or \
      tuple(program.aval(z).shape) != tuple(program.aval(out).shape):
    return None
  act = _classify(program, out, z, z_nodes + nodes, sink)
  if act is None:
    return None
  (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
  X, W = dot.ins
  items = (f"activation_grad:{act}",)
  layout = patterns._dot_layout(patterns._shape(program, X), patterns._shape(program, W),
                                tuple(lc), tuple(rc), tuple(lb), tuple(rb))
  consumed = frozenset({dot.index} | {node.index for node in nodes})
  precision = dot.params.get("precision")
  layout = patterns.precision_reason(precision) or layout
  if isinstance(layout, str):
    return Rejection(OP, items, layout, dot.index, consumed)
  transpose_x, transpose_w = layout
  static = [("out_dtype", jnp.dtype(program.aval(sink).dtype).name),
            ("activation_grad", act)]
  if transpose_x:
    static.append(("transpose_x", True))
  if transpose_w:
    static.append(("transpose_w", True))
  if precision is not None:
    static.append(("precision", precision))
  return Match(op=OP, items=items, positional=(("x", Operand(X)), ("w", Operand(W))),
               keywords=(("preactivation", Operand(z)),), static=tuple(static),
               outputs=(sink,), consumed=consumed, anchor=dot.index)

