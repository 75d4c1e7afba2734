"""A weight gradient and its Adam step as one `adam_matmul` call.

In a training step traced after `jax.grad`, a dense layer's weight gradient
dW = x^T @ dy is a dot_general contracting the leading (token) axes of two
operands, often followed by a transpose; optax's `adam`/`adamw` then read it
elementwise with the parameter and both moments. XLA writes dW and reads it
back in the optimizer's fusion. `match_adam` anchors at such a gemm, grows
the elementwise region of dW's shape that reads it, and, as `probe.py` does
for norms, does not match spellings: it replays the region on probe values
(each element its own experiment, the optimizer's scalars computed from probe
step counts by the program's own equations), reads b1, b2, eps, eps_root,
the weight decay and the learning rate off the results, and keeps them only if
`adam_reference.update` reproduces the region on fresh values at other
counts. The learning rate is the program's scalar where it is one (a
schedule's value), else the constant read off. The call replaces the gemm and
the update, provided nothing else reads dW (a global-norm clip does).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.extend import source_info_util

from pallas_kernels._src.ops import adam_reference
from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap import probe
from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap.patterns import Match, Operand, Rejection, Result
from pallas_kernels._src.swap.program import Lit, Node, Program, Val

OP = "adam_matmul"
#: Elementwise primitives an update region may hold (optax's transposed
#: gradients sum with `add_any`).
_ELEMENTWISE = probe.ELEMENTWISE | {"add_any"}
#: At most this many equations per parameter's update (optax's adamw: ~25).
_LIMIT = 96
#: Probe elements per replay.
_P = 64
#: Elementwise bound on the replay's error against the float64 reference (f32
#: arithmetic over a dozen steps).
_RTOL = 2e-5


class _NoMatch(Exception):
  """The region is not (or not provably) Adam's update."""



def _is_float(program: Program, v: Val) -> bool:
  return jnp.issubdtype(program.aval(v).dtype, jnp.floating)


def _gradient(program: Program, dot: Node):
  """(dW value, x, dy, contracted dims) of a weight-gradient gemm, or None.

  dot(a, b) contracting the leading axes of both is a^T @ b: x = a, dy = b;
  transposed after (jax's grad writes dy^T @ x, then a transpose), x = b,
  dy = a. Either way the kernel's transpose_x=True reads x as [M, K].
  """
  (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
  a, b = dot.ins
  sa, sb = patterns._shape(program, a), patterns._shape(program, b)
  if lb or rb or len(sa) < 2 or len(sb) < 2 or len(sa) != len(sb):
    return None
  lead = tuple(range(len(sa) - 1))
  if tuple(lc) != lead or tuple(rc) != lead or sa[:-1] != sb[:-1]:
    return None
  if not (_is_float(program, a) and _is_float(program, b)):
    return None
  g, x, dy, nodes = dot.outs[0], a, b, {dot.index}
  user = program.single_use(g)
  if user is not None and user.prim == "transpose" and \
      tuple(user.params["permutation"]) == (1, 0):
    g, x, dy = user.outs[0], b, a
    nodes.add(user.index)
  m = math.prod(sa[:-1])
  xs, ds = patterns._shape(program, x), patterns._shape(program, dy)
  x_op = Operand(x) if len(xs) == 2 else Operand(x, "reshape", (m, xs[-1]))
  dy_op = Operand(dy) if len(ds) == 2 else Operand(dy, "reshape", (m, ds[-1]))
  return g, x_op, dy_op, nodes


def _region(program: Program, g: int, taken: set[int]) -> list[int]:
  """Elementwise nodes of dW's shape computed from dW, in program order."""
  shape = patterns._shape(program, g)
  inside: set[Val] = {g}
  nodes: list[int] = []
  first = min(program.uses.get(g, [len(program.nodes)]))
  for node in program.nodes[first:]:
    if len(nodes) >= _LIMIT:
      break
    if node.index in taken or node.prim not in _ELEMENTWISE or not any(
        not isinstance(v, Lit) and v in inside for v in node.ins):
      continue
    if any(patterns._shape(program, o) != shape for o in node.outs):
      continue
    if any(not isinstance(v, Lit) and v not in inside and
           patterns._shape(program, v) != shape and program.size(v) != 1
           for v in node.ins):
      continue
    nodes.append(node.index)
    inside.update(node.outs)
  # The state's side computed apart (optax's b1 * mu), read by the region only.
  members = set(nodes)
  grew = True
  while grew and len(members) < _LIMIT:
    grew = False
    for i in sorted(members):
      for v in program.nodes[i].ins:
        node = program.node_of(v)
        if node is None or node.index in members or node.index in taken or \
            node.prim not in _ELEMENTWISE or \
            any(patterns._shape(program, o) != shape for o in node.outs) or \
            any(patterns._shape(program, u) != shape and program.size(u) != 1
                for u in node.ins) or \
            any(o in program.returned or any(u not in members for u in program.uses.get(o, ()))
                for o in node.outs):
          continue
        members.add(node.index)
        grew = True
  return sorted(members)


def _scalar_cone(program: Program, v: Val) -> tuple[set[int], set[int]]:
  """(scalar nodes computing `v`, the values they start from): the step
  count, a schedule's count, or a scalar made from arrays (a norm)."""
  nodes: set[int] = set()
  leaves: set[int] = set()
  stack = [v]
  while stack:
    u = stack.pop()
    if isinstance(u, Lit) or program.value_of(u) is not None:
      continue
    node = program.node_of(u)
    if node is None or any(program.size(o) != 1 for o in node.outs) or any(
        program.size(i) != 1 for i in node.ins):
      leaves.add(u)
      continue
    if node.index not in nodes:
      nodes.add(node.index)
      stack.extend(node.ins)
  return nodes, leaves


def _f32(x):
  x = np.asarray(x)
  return x.astype(np.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x


class _Replay:
  """The region and the scalars it reads, evaluated eagerly on this CPU on
  probe vectors of `_P` elements (float converts as identities, in float32)."""

  def __init__(self, program: Program, g: int, nodes: list[int]):
    self.program, self.g, self.nodes = program, g, nodes
    shape = patterns._shape(program, g)
    inside = {g} | {o for i in nodes for o in program.nodes[i].outs}
    ext = [v for i in nodes for v in program.nodes[i].ins
           if not isinstance(v, Lit) and v not in inside and program.value_of(v) is None]
    ext = list(dict.fromkeys(ext))
    self.arrays: list[int] = []
    #: Scalars read directly, or broadcast to dW's shape (value -> its scalar).
    self.scalars: dict[int, int] = {}
    for v in ext:
      if patterns._shape(program, v) == shape:
        node = program.node_of(v)
        if node is not None and node.prim == "broadcast_in_dim" and \
            program.size(node.ins[0]) == 1 and not isinstance(node.ins[0], Lit):
          self.scalars[v] = node.ins[0]
          continue
        self.arrays.append(v)
      else:
        self.scalars[v] = v
    self.cone: set[int] = set()
    leaves: set[int] = set()
    for s in set(self.scalars.values()):
      n, lv = _scalar_cone(program, s)
      self.cone |= n
      leaves |= lv
    for lv in leaves:
      if patterns._shape(program, lv) not in ((), (1,)):
        raise _NoMatch("a scalar the update reads has no replayable form")
    self.counts = sorted(v for v in leaves
                         if jnp.issubdtype(program.aval(v).dtype, jnp.integer))
    self.floats = sorted(v for v in leaves if _is_float(program, v))
    if len(self.counts) + len(self.floats) != len(leaves):
      raise _NoMatch("a scalar the update reads starts from a non-numeric value")

  def scalar_values(self, counts: dict[int, int], floats: dict[int, float]) -> dict[int, Any]:
    program = self.program
    env: dict[int, Any] = {}
    for v, c in counts.items():
      env[v] = np.asarray(c, program.aval(v).dtype).reshape(program.aval(v).shape)
    for v, f in floats.items():
      env[v] = np.asarray(f, program.aval(v).dtype).reshape(program.aval(v).shape)

    def read(u):
      if isinstance(u, Lit):
        return u.value
      return env[u] if u in env else program.value_of(u)

    with prog_lib.eager_here():
      for i in sorted(self.cone):
        node = program.nodes[i]
        out = prog_lib.bind(node.eqn, [read(u) for u in node.ins])
        outs = out if node.eqn.primitive.multiple_results else [out]
        env.update((o, np.asarray(val)) for o, val in zip(node.outs, outs))
    return env

  def run(self, g: np.ndarray, arrays: dict[int, np.ndarray], scalars: dict[int, Any]
          ) -> dict[int, np.ndarray]:
    """Every region value (float32 [P]) for probe dW `g` and externals."""
    program = self.program
    env: dict[Val, Any] = {self.g: g.astype(np.float32)}
    env.update((v, a.astype(np.float32)) for v, a in arrays.items())
    for v, s in self.scalars.items():
      val = _f32(scalars[s]).reshape(())
      env[v] = np.broadcast_to(val, g.shape) if v != s else val

    def read(u):
      if isinstance(u, Lit):
        return _f32(u.value)
      if u in env:
        return env[u]
      known = _f32(program.value_of(u))
      if known.size == 1:
        return known
      if known.size and np.all(known == known.flat[0]):  # a broadcast constant
        return np.broadcast_to(known.flat[0], g.shape)
      raise _NoMatch("the update reads a constant array")

    with prog_lib.eager_here():
      for i in self.nodes:
        node = program.nodes[i]
        invals = [read(u) for u in node.ins]
        if node.prim == "convert_element_type" and \
            jnp.issubdtype(node.params["new_dtype"], jnp.floating):
          outs = [_f32(invals[0])]
        else:
          out = prog_lib.bind(node.eqn, invals)
          outs = out if node.eqn.primitive.multiple_results else [out]
        env.update((o, _f32(val)) for o, val in zip(node.outs, outs))
    return env


def _close(got, want) -> bool:
  got = np.asarray(got, np.float64)
  want = np.asarray(want, np.float64)
  if got.shape != want.shape or not np.all(np.isfinite(got)):
    return False
  floor = 1e-6 * float(np.max(np.abs(want), initial=0.0))
  return bool(np.all(np.abs(got - want) <= _RTOL * np.abs(want) + floor))


def _snap(v: float) -> float:
  """The shortest decimal within a few float32 ulps of `v` (0.9, not
  0.8999999762): values read through float32 arithmetic carry its rounding;
  the verification that follows holds the snapped value to the program."""
  v = float(v)
  for digits in range(1, 8):
    short = float(f"{v:.{digits}g}")
    if abs(short - v) <= 4e-7 * abs(v):
      return short
  return float(str(np.float32(v)))


def _roles(rp: _Replay, rng):
  """Identifies mu', nu' and the update among the region's values on random
  probes: ((mu' value, mu), (nu', nu), (param', param, update value, sign),
  b1, b2, k) with k the factor dW is scaled by before the moments."""
  program = rp.program
  if len(rp.arrays) < 3:
    raise _NoMatch("the update reads fewer than three arrays of dW's shape")
  g = rng.standard_normal(_P)
  g[:2] = (0.0, 1.0)
  arrays = {}
  for v in rp.arrays:
    a = rng.uniform(0.5, 1.5, _P)
    a[:2] = (1.0, 0.0)
    arrays[v] = a
  counts = {v: 3 + 5 * j for j, v in enumerate(rp.counts)}
  floats = {v: rng.uniform(0.5, 2.0) for v in rp.floats}
  env = rp.run(g, arrays, rp.scalar_values(counts, floats))
  values = [o for i in rp.nodes for o in program.nodes[i].outs if _is_float(program, o)]
  mus, nus = [], []
  for v in values:
    out = np.asarray(env[v], np.float64)
    b = _snap(out[0])
    if not 0.0 < b < 1.0:
      continue
    k = out[1] / (1.0 - b)
    if abs(k) < 1e-3:
      continue  # b * state alone
    for e in rp.arrays:
      if _close(out, b * arrays[e] + (1.0 - b) * k * g):
        mus.append((v, e, b, k))
      elif _close(out, b * arrays[e] + (1.0 - b) * k * g * g):
        nus.append((v, e, b, k))
  if not mus or not nus:
    raise _NoMatch("no value of the region is Adam's first and second moment of dW")
  # The last one in program order: the state the step returns (after casts).
  mu_v, mu, b1, k = max(mus, key=lambda t: program.producer[t[0]])
  nu_v, nu, b2, k2 = max(nus, key=lambda t: program.producer[t[0]])
  if mu == nu or not math.isclose(k * k, k2, rel_tol=1e-4):
    raise _NoMatch("the moments do not read one gradient and two states")
  params = []
  for i in rp.nodes:
    node = program.nodes[i]
    if node.prim not in ("add", "sub"):
      continue
    a, b = node.ins
    # param' = param + update (optax's apply_updates), or param - update.
    forms = ((a, b, 1.0), (b, a, 1.0)) if node.prim == "add" else ((a, b, -1.0),)
    for p, w, sign in forms:
      if p in rp.arrays and p not in (mu, nu) and not isinstance(w, Lit):
        params.append((node.outs[0], p, w, sign))
  if not params:
    raise _NoMatch("no value of the region adds an update to a third array (the param)")
  out = _through_converts(program, params[-1][0], set(rp.nodes))
  return (mu_v, mu), (nu_v, nu), (out,) + params[-1][1:], b1, b2, k


def _through_converts(program: Program, v: int, region: set[int]) -> int:
  while True:
    user = program.single_use(v)
    if user is None or user.index not in region or not patterns._float_convert(user, program):
      return v
    v = user.outs[0]


def match_adam(program: Program, dot: Node, taken: set[int]) -> Result:
  """x^T @ dy read only by optax's Adam update of one parameter, as one
  `adam_matmul` call; None where the gemm feeds no Adam update."""
  if dot.index in taken:
    return None
  found = _gradient(program, dot)
  if found is None:
    return None
  g, x_op, dy_op, grad_nodes = found
  nodes = _region(program, g, taken | grad_nodes)
  if not nodes:
    return None
  try:
    # Eagerly on this CPU, whatever trace the swap runs under (the probes and
    # the reference's bias corrections are concrete numbers).
    with prog_lib.eager_here():
      rp = _Replay(program, g, nodes)
      return _identify(program, dot, rp, g, x_op, dy_op, grad_nodes)
  except (_NoMatch, TypeError, ValueError, KeyError):
    return None  # not Adam's update, or a region the replay cannot evaluate


def _update_ref(g, p, mu, nu, count, lr, h: dict[str, float]):
  """(param', mu', nu', the update) in float64, `adam_reference.update`'s
  terms in its order."""
  b1, b2 = h["b1"], h["b2"]
  t = min(count + 1, np.iinfo(np.int32).max)
  c1, c2 = 1 - b1 ** t, 1 - b2 ** t
  mu2 = (1 - b1) * g + b1 * mu
  nu2 = (1 - b2) * (g * g) + b2 * nu
  u = (mu2 / c1) / (np.sqrt(nu2 / c2 + h["eps_root"]) + h["eps"]) + h["weight_decay"] * p
  return p - lr * u, mu2, nu2, -lr * u


def _identify(program: Program, dot: Node, rp: _Replay, g: int, x_op: Operand,
              dy_op: Operand, grad_nodes: set[int]) -> Result:
  rng = np.random.default_rng(0)
  roles = _roles(rp, rng)
  (mu_v, mu), (nu_v, nu), (param_v, p, w, sign), b1, b2, k = roles
  cone = _cone(program, (param_v, mu_v, nu_v), set(rp.nodes), g)
  items = ("adam update",)
  # Nothing else may read dW or a value between it and the results.
  consumed = grad_nodes | cone
  inner = {o for i in consumed for o in program.nodes[i].outs} - {param_v, mu_v, nu_v}
  readers = sorted({u for v in inner for u in program.uses.get(v, ()) if u not in consumed})
  if readers or inner & program.returned:
    what = (f"{program.nodes[readers[0]].prim} at "
            f"{_line(program.nodes[readers[0]])}" if readers else "the function's result")
    return Rejection(OP, items, (
        f"dW (or a value of its update) is also read by {what} (e.g. a global-norm "
        "clip reading every gradient), so it would still be written"),
        dot.index, frozenset(consumed))
  if not math.isclose(k, 1.0, rel_tol=1e-6):
    return Rejection(OP, items, (
        "dW is scaled by a scalar computed elsewhere (e.g. from a global norm) before "
        "Adam reads it; the kernel applies Adam to x^T @ dy itself"),
        dot.index, frozenset(grad_nodes | cone))
  lr_ops = [s for v, s in rp.scalars.items() if any(
      v in program.nodes[i].ins for i in cone)]
  fitted = None
  for count in rp.counts:
    try:
      fitted = _fit_and_verify(rp, roles, count, lr_ops, rng)
      break
    except _NoMatch:
      continue
  if fitted is None:
    raise _NoMatch("no step count reproduces the bias corrections")
  count, h, lr = fitted
  static = []
  keywords = []
  if isinstance(lr, Operand):
    keywords.append(("learning_rate", lr))
  else:
    static.append(("learning_rate", lr))
  static += [(n, h[n]) for n in ("b1", "b2", "eps", "eps_root", "weight_decay")]
  static.append(("transpose_x", True))
  # In place where the step's own jit donates the state it updates (jit the
  # swapped step with the same donation); aliased undonated state, XLA
  # would copy every parameter, mu and nu before the update.
  static.append(("in_place", all(v in program.donated for v in (p, mu, nu))))
  items = ("adamw update",) if h["weight_decay"] else items
  return Match(op=OP, items=items,
               positional=(("x", x_op), ("dy", dy_op), ("param", Operand(p)),
                           ("mu", Operand(mu)), ("nu", Operand(nu)),
                           ("count", Operand(count))),
               keywords=tuple(keywords), static=tuple(static),
               outputs=(param_v, mu_v, nu_v), consumed=frozenset(consumed),
               anchor=dot.index)


def _line(node: Node) -> str:
  return source_info_util.summarize(node.eqn.source_info)


def _cone(program: Program, outs, region: set[int], g: int) -> set[int]:
  """Region nodes the results need."""
  need: set[int] = set()
  stack = list(outs)
  while stack:
    v = stack.pop()
    if isinstance(v, Lit) or v == g:
      continue
    i = program.producer.get(v)
    if i is None or i not in region or i in need:
      continue
    need.add(i)
    stack.extend(program.nodes[i].ins)
  return need


def _fit_and_verify(rp: _Replay, roles, count: int, lr_ops, rng):
  """(count value id, constants, learning rate) for one step-count
  candidate: constants read off designed probes, then checked on fresh
  random probes at other counts; raises _NoMatch where they do not hold."""
  (mu_v, mu), (nu_v, nu), (param_v, p, w, sign), b1, b2, _ = roles
  others = [v for v in rp.arrays if v not in (mu, nu, p)]

  def run(cnts, flts, g, arrays):
    scal = rp.scalar_values(cnts, flts)
    env = rp.run(g, {**{v: np.ones(_P) for v in others}, **arrays}, scal)
    return scal, env

  def leaves(base):
    cnts = {v: base + 7 * j for j, v in enumerate(rp.counts)}
    flts = {v: rng.uniform(0.5, 2.0) for v in rp.floats}
    return cnts, flts

  # Designed probes, each element one experiment, at a count where the bias
  # corrections are 1 in float32 (at small counts 1 - b2**t loses digits).
  cnts, flts = leaves(2)
  cnts[count] = 1 << 20
  t = cnts[count]
  c1, c2 = (float(c) for c in adam_reference.bias_corrections(t, b1, b2))
  g = np.zeros(_P)
  m_a, n_a, p_a = np.ones(_P) * c1 / b1, np.ones(_P) * c2 / b2, np.zeros(_P)
  # 0: mu' = 0, param 1: the update is -lr * wd.
  m_a[0], n_a[0], p_a[0] = 0.0, 1.0, 1.0
  # 1: mu_hat = nu_hat = 1: the update is -lr / (sqrt(1 + eps_root) + eps).
  # 2: nu_hat = 0: -lr * mu_hat / (sqrt(eps_root) + eps), mu_hat tiny.
  tiny = 1e-8
  m_a[2], n_a[2] = tiny * c1 / b1, 0.0
  scal, env = run(cnts, flts, g, {mu: m_a, nu: n_a, p: p_a})
  upd = sign * np.asarray(env[w], np.float64)
  if not upd[1] < 0:
    raise _NoMatch("no learning rate")
  # upd[1] = -lr / (sqrt(1 + eps_root) + eps): a fixed point in lr and eps.
  eps = root = 0.0
  for _ in range(3):
    lr = -upd[1] * (math.sqrt(1.0 + root) + eps)
    z0 = -lr * tiny / upd[2] if upd[2] < 0 else 0.0
    if z0 <= 0:
      eps = root = 0.0
      continue
    # 3: nu_hat = z0**2 separates eps from eps_root: sqrt(z0^2 + er) + eps.
    m_a[3], n_a[3] = tiny * c1 / b1, z0 * z0 * c2 / b2
    _, env3 = run(cnts, flts, g, {mu: m_a, nu: n_a, p: p_a})
    z1 = -lr * tiny / (sign * float(np.asarray(env3[w])[3]))
    eps = (z1 + z0 - z0 * z0 / (z1 - z0)) / 2 if z1 > z0 else z0
    eps = min(max(eps, 0.0), z0)
    root = max(z0 - eps, 0.0) ** 2
    if math.sqrt(root) < 1e-3 * z0:
      eps, root = z0, 0.0
    elif eps < 1e-3 * z0:
      eps, root = 0.0, z0 * z0
  wd = -upd[0] / lr
  h = {"b1": b1, "b2": b2, "eps": _snap(eps), "eps_root": _snap(root),
       "weight_decay": _snap(wd) if abs(wd) > 1e-7 else 0.0}
  # The learning rate: a scalar of the program (a schedule's value) when one
  # equals it, else the constant read off.
  lr_op: Operand | float = _snap(lr)
  for s in lr_ops:
    val = float(np.asarray(scal[s], np.float64).reshape(()))
    if math.isclose(val, lr, rel_tol=1e-5):
      lr_op = Operand(s)
      break
    if math.isclose(-val, lr, rel_tol=1e-5):
      lr_op = Operand(s, "neg")
      break
  # Verification on fresh values, other counts and other free scalars.
  for base in (0, 40):
    cnts, flts = leaves(base)
    gv = rng.standard_normal(_P)
    gv[:4] = 0.0
    arrays = {mu: rng.standard_normal(_P), nu: rng.uniform(0.0, 2.0, _P),
              p: rng.standard_normal(_P)}
    if h["eps"] or h["eps_root"]:
      arrays[nu][:2] = 0.0  # eps (and eps_root) alone under the root
      arrays[mu][:2] *= 1e-8
    arrays[mu][2:4] = 0.0  # the weight decay alone
    scal, env = run(cnts, flts, gv, arrays)
    if isinstance(lr_op, Operand):
      lr_val = float(np.asarray(scal[lr_op.val], np.float64).reshape(()))
      lr_val = -lr_val if lr_op.transform == "neg" else lr_val
    else:
      lr_val = lr_op
    want = _update_ref(gv, arrays[p], arrays[mu], arrays[nu], cnts[count], lr_val, h)
    # The reference in float32, as the kernel's references compute it.
    ref32 = adam_reference.update(
        jnp.asarray(gv, jnp.float32), jnp.asarray(arrays[p], jnp.float32),
        jnp.asarray(arrays[mu], jnp.float32), jnp.asarray(arrays[nu], jnp.float32),
        *adam_reference.bias_corrections(cnts[count], h["b1"], h["b2"]),
        jnp.float32(lr_val), **h)
    got = (env[param_v], env[mu_v], env[nu_v], sign * np.asarray(env[w], np.float64))
    if not all(_close(a, b) for a, b in zip(got, want)) or \
        not all(_close(a, b) for a, b in zip(got[:3], ref32)):
      raise _NoMatch("the constants read off do not reproduce the update")
  return count, h, lr_op
