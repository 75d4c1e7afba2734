"""A group norm and its activation as one `group_norm` call; in a training
step traced after `jax.grad`, its backward as a second.

flax's `nn.GroupNorm` reshapes x [N, ..., C] to [N, ..., G, C/G] and sums
over every axis but the sample's and the group's; the anchor is that sum.
As `cross_entropy.py` does for the loss, the chain is not matched by its
spelling: from x, the value of x's shape whose equations read nothing but
x, two per-channel vectors and constants, and that replays (random x, scale
and bias) as `reference.group_norm` for some epsilon among the chain's
constants and some activation, is the output. The group mean and variance
the chain computes on the way are found the same way; the forward call
writes them.

In a training step the backward reads the forward's intermediates. Its
results are found by replay too: the values of x's shape (dx) and of C
elements (dscale, dbias) computed from the forward's values and one array
of the output's shape (the cotangent), that equal the op's VJP. The second
call reads x, the parameters, the forward's mean and variance and the
cotangent, and writes the gradients; nothing the two calls absorb may be read
elsewhere.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import tolerances
from pallas_kernels._src.swap import backward as backward_lib
from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap import probe
from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap.patterns import Match, Operand, Rejection, Result
from pallas_kernels._src.swap.program import Lit, Node, Program, Val

OP = "group_norm"
#: Equations a group norm's forward and backward are made of.
_SHAPE = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims"})
_CHAIN = probe.ELEMENTWISE | _SHAPE | frozenset({
    "reduce_sum", "reduce_max", "logistic", "integer_pow", "custom_jvp_call", "add_any"})
#: Chains of more elements than this are not replayed (left to XLA, saying so).
MAX_REPLAY = 1 << 24


def _float(program: Program, v: Val) -> bool:
  return jnp.issubdtype(program.aval(v).dtype, jnp.floating)


@dataclasses.dataclass(frozen=True, slots=True)
class _Geometry:
  """x [N, ..., C] normalized over groups of C/G channels per sample."""

  shape: tuple[int, ...]
  groups: int

  @property
  def n(self) -> int:
    return self.shape[0]

  @property
  def c(self) -> int:
    return self.shape[-1]

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def sizes(self) -> frozenset[int]:
    """Element counts a value of the chain can have."""
    return frozenset({self.size, self.n * self.groups, self.n * self.c, self.c,
                      self.n, self.groups, 1})


def _region(program: Program, starts, geo: _Geometry, live: set[int],
            taken: set[int]) -> set[int]:
  """The live nodes computed from `starts` with the chain's equations and
  element counts."""
  found: set[int] = set()
  stack = list(starts)
  while stack:
    for u in program.uses.get(stack.pop(), ()):
      node = program.nodes[u]
      if u in found or u in taken or u not in live or node.prim not in _CHAIN or \
          not all(program.size(o) in geo.sizes for o in node.outs):
        continue
      found.add(u)
      stack.extend(node.outs)
  return found


def _cone(program: Program, out: Val, inside: set[int], stops: set[Val], c: int):
  """(nodes of `inside` computing `out` back to `stops`, the other values
  they read), literals and constants aside but for constants of C elements
  (parameters a step closes over)."""
  nodes: set[int] = set()
  outside: set[Val] = set()
  stack = [out]
  while stack:
    v = stack.pop()
    if isinstance(v, Lit) or v in stops or (
        program.value_of(v) is not None and program.size(v) != c):
      continue
    node = program.node_of(v)
    if node is None or node.index not in inside:
      outside.add(v)
    elif node.index not in nodes:
      nodes.add(node.index)
      stack.extend(node.ins)
  return nodes, outside


def _param(program: Program, v: Val, c: int) -> tuple[Val, set[int]] | None:
  """(the parameter, the nodes reshaping or widening it) of a per-channel
  operand `v` of C elements; None where `v` is not one."""
  chain: set[int] = set()
  while program.size(v) == c and _float(program, v):
    node = program.node_of(v)
    if node is None or node.prim not in _SHAPE | {"convert_element_type"}:
      return v, chain
    chain.add(node.index)
    v = node.ins[0]
  return None


def _params(program: Program, outside: set[Val], c: int):
  """{operand: (parameter, chain)} of per-channel operands, or None where
  one is not per-channel."""
  found = {}
  for v in outside:
    got = _param(program, v, c)
    if got is None:
      return None
    found[v] = got
  return found


def _epsilons(program: Program, nodes: set[int]) -> list[float]:
  found = set()
  for i in nodes:
    for v in program.nodes[i].ins:
      value = program.value_of(v)
      if value is None or np.ndim(value) != 0 or not np.issubdtype(
          np.asarray(value).dtype, np.floating):
        continue
      written = probe.epsilon_as_written(value)
      if written is not None:
        found.add(written)
  return sorted(found)


def _reference():
  from pallas_kernels._src.ops.group_norm import reference  # noqa: PLC0415
  return reference


def _activations() -> tuple[str | None, ...]:
  """What a replay tries after the affine: none first, then the op's."""
  return (None,) + tuple(a for a in _reference().ACTIVATIONS if a != "identity")


def _close(got, want, dtype) -> bool:
  got = np.asarray(got, np.float32).reshape(-1)
  want = np.asarray(want, np.float32).reshape(-1)
  return got.shape == want.shape and bool(np.isfinite(got).all()) and \
      tolerances.relative_error(got, want) <= tolerances.tolerance(dtype)


class _Replay:
  """Random x, scale, bias and cotangent, and what the op's reference makes
  of them."""

  def __init__(self, program: Program, x: Val, geo: _Geometry, seed: int = 0):
    rng = np.random.default_rng(seed)
    self.program, self.x, self.geo = program, x, geo
    # Offsets per channel, so that each group's mean matters.
    self.xs = (rng.standard_normal(geo.shape) * 1.5 +
               rng.standard_normal(geo.c)).astype(np.float32)
    self.scale = (1 + 0.5 * rng.standard_normal(geo.c)).astype(np.float32)
    self.bias = rng.standard_normal(geo.c).astype(np.float32)
    self.cot = rng.standard_normal(geo.shape).astype(np.float32)
    self.dtype = program.aval(x).dtype
    # (epsilon, activation) -> the reference's y: asked again for every
    # candidate output and every order of the two parameters.
    self._forward: dict[tuple[float, str | None], jax.Array] = {}

  def run(self, nodes: set[int], params: dict, which: tuple[Val, Val],
          g: Val | None = None) -> dict:
    """The program's values: `which` (scale's, bias's parameter) fed."""
    inputs = {self.x: (self.xs, self.dtype)}
    chains: set[int] = set()
    for v, (root, chain) in params.items():
      value = self.scale if root == which[0] else self.bias
      inputs[root] = (value.reshape(self.program.aval(root).shape),
                      self.program.aval(root).dtype)
      chains |= chain
    if g is not None:
      inputs[g] = (self.cot.reshape(self.program.aval(g).shape), self.program.aval(g).dtype)
    return backward_lib.replay_nodes(self.program, chains | nodes, inputs)

  def forward(self, eps: float, activation):
    if (eps, activation) not in self._forward:
      with prog_lib.eager_here():
        self._forward[eps, activation] = _reference().group_norm_f32(
            jnp.asarray(self.xs), jnp.asarray(self.scale), jnp.asarray(self.bias),
            groups=self.geo.groups, epsilon=eps, activation=activation)
    return self._forward[eps, activation]

  def statistics(self):
    ref = _reference()
    with prog_lib.eager_here():
      return ref.statistics(jnp.asarray(self.xs), groups=self.geo.groups)

  def grads(self, eps: float, activation):
    ref = _reference()
    with prog_lib.eager_here():
      _, pull = jax.vjp(lambda x, s, b: ref.group_norm_f32(
          x, s, b, groups=self.geo.groups, epsilon=eps, activation=activation),
          jnp.asarray(self.xs), jnp.asarray(self.scale), jnp.asarray(self.bias))
      return dict(zip(("x", "scale", "bias"), pull(jnp.asarray(self.cot))))


def _forward(program: Program, x: Val, geo: _Geometry, region: set[int], replay: _Replay):
  """(output, nodes, params, (scale, bias) parameters, epsilon, activation)
  of the group norm reading x, or None."""
  candidates = sorted((o for i in region for o in program.nodes[i].outs
                       if program.size(o) == geo.size and _float(program, o)),
                      key=program.producer.__getitem__, reverse=True)
  for out in candidates:
    nodes, outside = _cone(program, out, region, {x}, geo.c)
    params = _params(program, outside, geo.c)
    roots = sorted({root for root, _ in (params or {}).values()}, key=str)
    if params is None or len(roots) != 2:
      continue
    epsilons = _epsilons(program, nodes)
    for which in itertools.permutations(roots):
      env = replay.run(nodes, params, which)
      got = env[out]
      for eps, act in itertools.product(epsilons, _activations()):
        if _close(got, replay.forward(eps, act), replay.dtype):
          return out, nodes, params, which, eps, act, env
  return None


def _statistic(program: Program, nodes: set[int], env: dict, want, geo: _Geometry):
  """The chain's value holding `want` ([N, G]), earliest first; or None."""
  for i in sorted(nodes):
    for o in program.nodes[i].outs:
      if program.size(o) == geo.n * geo.groups and _float(program, o) and \
          _close(env[o], want, jnp.float32):
        return o
  return None


def match_group_norm(program: Program, red: Node, taken: set[int]) -> Result:
  """A reduce over a [N, ..., G, C/G] view of x, but for the sample and
  group axes: the group norm reading x as one `group_norm` call (and, in a
  training step, its backward as a second); None where it is no group norm."""
  if red.index in taken:
    return None
  z = red.ins[0]
  zs = tuple(program.aval(z).shape)
  rank = len(zs)
  if rank < 3 or tuple(red.params["axes"]) != tuple(range(1, rank - 2)) + (rank - 1,):
    return None
  view = program.node_of(z)
  if view is None or view.prim != "reshape" or not _float(program, z):
    return None
  x = view.ins[0]
  xs = tuple(program.aval(x).shape)
  if xs != zs[:-2] + (zs[-2] * zs[-1],) or zs[-1] < 2:
    return None
  geo = _Geometry(xs, zs[-2])
  live = backward_lib.live(program)
  region = _region(program, [x], geo, live, taken)
  if geo.size > MAX_REPLAY:
    return Rejection(OP, (), (
        f"x {patterns.describe_aval(program.aval(x))} is larger than the {MAX_REPLAY} "
        "elements the swap replays to recognise a group norm"), red.index)
  replay = _Replay(program, x, geo)
  found = _forward(program, x, geo, region, replay)
  if found is None:
    return None
  y, nodes, params, (scale, bias), eps, act, env = found
  items = (f"activation:{act}",) if act else ()

  def operand(root):
    c = geo.c
    return Operand(root) if tuple(program.aval(root).shape) == (c,) else \
        Operand(root, "reshape", (c,))

  positional = (("x", Operand(x)), ("scale", operand(scale)), ("bias", operand(bias)))
  pool = _pool(program, y, geo, taken, live)
  static = (("groups", geo.groups), ("epsilon", eps), ("activation", act),
            ("shape", tuple(program.aval(y if pool is None else pool.outs[0]).shape)))
  if pool is not None:  # y read only by a global average pool's sum
    items += ("pooled",)
    static += (("pooled", True),)
  inner = {o for i in nodes for o in program.nodes[i].outs} - {y}
  # Readers nothing returned needs (tracing leaves them) go with the call.
  dead = backward_lib.dead_readers(program, nodes, live)
  readers = {u for v in inner for u in program.uses.get(v, ()) if u not in nodes | dead}
  follow, outputs = None, (y,)
  if readers or inner & program.returned:
    mean_v, var_v = replay.statistics()
    mean = _statistic(program, nodes, env, mean_v, geo)
    var = _statistic(program, nodes, env, var_v, geo)
    if mean is None or var is None:
      return Rejection(OP, items, (
          "the chain's intermediates are read elsewhere (a backward?) and it holds "
          "no group mean and variance the backward could read"), red.index,
          frozenset(nodes))
    follow = _backward(program, x, y, geo, nodes, params, (scale, bias), eps, act,
                       positional, static, (mean, var), live, taken, replay)
    if isinstance(follow, str):
      return Rejection(OP, items, (
          "the chain's intermediates are read elsewhere, so they would still be "
          f"written ({follow})"), red.index, frozenset(nodes))
    outputs = (y, mean, var)
    # (Each as the program held it: a keepdims variance beside a flat mean.)
    static += (("statistics", (tuple(program.aval(mean).shape),
                               tuple(program.aval(var).shape))),)
  else:
    nodes = nodes | dead
  if pool is not None:
    outputs = (pool.outs[0],) + outputs[1:]
    nodes = nodes | {pool.index}
  return Match(op=OP, items=items, positional=positional, keywords=(), static=static,
               outputs=outputs, consumed=frozenset(nodes), anchor=red.index,
               follow=follow)


def _backward(program: Program, x: Val, y: Val, geo: _Geometry, fwd: set[int],
              params: dict, which: tuple[Val, Val], eps: float, act, positional,
              static, stats: tuple[Val, Val], live: set[int], taken: set[int],
              replay: _Replay) -> Match | str:
  """The forward's backward as a second call (the op's VJP at the output's
  cotangent, from the forward's statistics), or why the forward's other
  readers are not that backward."""
  made = {o for i in fwd for o in program.nodes[i].outs}
  area = _region(program, made - {y}, geo, live, taken) - fwd
  stops = made | {x}
  want = replay.grads(eps, act)
  found: dict[str, tuple[Val, set[int]]] = {}
  g = None
  candidates = sorted((o for i in area for o in program.nodes[i].outs
                       if _float(program, o) and program.size(o) in (geo.size, geo.c)),
                      key=program.producer.__getitem__)
  # Values computed from the forward's intermediates: not the cotangent,
  # which the step computes from y (a loss of y) or from elsewhere.
  tainted = set(made - {y})
  for i in sorted(area):
    if any(v in tainted for v in program.nodes[i].ins if not isinstance(v, Lit)):
      tainted.update(program.nodes[i].outs)
  for o in candidates:
    kinds = [k for k in (("x",) if program.size(o) == geo.size else ("scale", "bias"))
             if k not in found]
    if not kinds:
      continue
    for cot in _cotangents(program, o, area, stops, tainted, geo, g):
      nodes, outside = _cone(program, o, area, stops | {cot}, geo.c)
      more = _params(program, outside - {cot}, geo.c)
      if more is None or not {root for root, _ in more.values()} <= set(which):
        continue
      env = replay.run(fwd | nodes, {**params, **more}, which, g=cot)
      k = next((k for k in kinds if _close(env[o], want[k], program.aval(o).dtype)), None)
      if k is not None:
        found[k], g = (o, nodes), cot
        break
  if not found:
    return "no value the backward computes is the group norm's gradient"
  if "x" in found:
    summed = _bias_gradient(program, found["x"][0], geo, taken)
    if summed is not None:  # a bias added before the norm: the kernel sums dx
      found["x_sum"] = (summed.outs[0], {summed.index})
  order = tuple(k for k in ("x", "scale", "bias", "x_sum") if k in found)
  outputs = tuple(found[k][0] for k in order)
  consumed = set().union(*(found[k][1] for k in order))
  consumed |= backward_lib.dead_readers(program, consumed | fwd, live)
  mean, var = stats
  needed = {x, g, mean, var} | {root for root, _ in params.values()}
  consumed |= backward_lib.orphans(program, consumed | fwd, taken, needed)
  consumed -= fwd
  if consumed & taken:
    return "an earlier kernel call took part of the backward"
  cot = Operand(g, "reshape", geo.shape)
  spread = _row_cotangent(program, g, geo)
  if spread is not None:  # the kernel reads each sample's one row
    row, node = spread
    cot = Operand(row, "reshape", (geo.n,) + (1,) * (len(geo.shape) - 2) + (geo.c,))
    if g not in program.returned and node.index not in taken and all(
        u in consumed | fwd for u in program.uses.get(g, ())):
      consumed.add(node.index)
  keep = {y, mean, var, *outputs}
  for i in consumed | fwd:
    for o in program.nodes[i].outs:
      if o not in keep and (o in program.returned or any(
          u not in consumed | fwd for u in program.uses.get(o, ()))):
        return "a value between x and its gradient is read elsewhere"
  pair = (geo.n, geo.groups)
  return Match(
      op=OP, items=("backward",), positional=positional,
      keywords=(("mean", Operand(mean, "reshape", pair)),
                ("var", Operand(var, "reshape", pair)),
                ("cotangent", cot)),
      static=tuple(kv for kv in static if kv[0] not in ("shape", "pooled")) + (
          ("grads", order),
          ("dtypes", tuple(jnp.dtype(program.aval(o).dtype).name for o in outputs)),
          ("shapes", tuple(tuple(program.aval(o).shape) for o in outputs))),
      outputs=outputs, consumed=frozenset(consumed),
      anchor=min(program.producer[o] for o in outputs))


def _pool(program: Program, y: Val, geo: _Geometry, taken: set[int],
          live: set[int]) -> Node | None:
  """The sum of y over every axis but the first and last (a global average
  pool's) when it is all that reads y, or None."""
  rank = len(geo.shape)
  readers = [u for u in program.uses.get(y, ()) if u in live]
  if y in program.returned or len(readers) != 1 or rank < 3:
    return None
  node = program.nodes[readers[0]]
  if node.prim != "reduce_sum" or node.index in taken or \
      tuple(node.params["axes"]) != tuple(range(1, rank - 1)) or \
      tuple(program.aval(y).shape) != geo.shape:
    return None
  return node


def _bias_gradient(program: Program, dx: Val, geo: _Geometry, taken: set[int]) -> Node | None:
  """The sum of dx over every axis but the last that reads it (the gradient
  of a bias added to x, as a convolution's), or None."""
  rank = len(program.aval(dx).shape)
  for u in program.uses.get(dx, ()):
    node = program.nodes[u]
    if node.prim == "reduce_sum" and u not in taken and \
        tuple(node.params["axes"]) == tuple(range(rank - 1)) and \
        tuple(program.aval(dx).shape)[-1] == geo.c:
      return node
  return None


def _row_cotangent(program: Program, g: Val, geo: _Geometry) -> tuple[Val, Node] | None:
  """(the [N, C] values, the broadcast) where the cotangent `g` broadcasts
  one row per sample over the middle axes (a global average pool's
  gradient), or None."""
  node = program.node_of(g)
  if node is None or node.prim != "broadcast_in_dim":
    return None
  src, last = node.ins[0], len(geo.shape) - 1
  dims = node.params["broadcast_dimensions"]
  shape = tuple(program.aval(src).shape)
  if isinstance(src, Lit) or program.size(src) != geo.n * geo.c or not all(
      d == 1 or int(b) in (0, last) for d, b in zip(shape, dims)):
    return None
  return src, node


def _cotangents(program: Program, out: Val, area: set[int], stops: set[Val],
                tainted: set[Val], geo: _Geometry, known: Val | None) -> list[Val]:
  """The values of y's size `out` may read as y's cotangent, earliest first:
  the one it reads from outside the chain, or, where the step computes it
  from y (a loss of the output), those of its equations' results that no
  intermediate of the forward computes. Only `known` once one is found."""
  if known is not None:
    return [known]
  nodes, outside = _cone(program, out, area, stops, geo.c)
  sized = [v for v in outside if program.size(v) == geo.size and _float(program, v)]
  if sized:
    return sized if len(sized) == 1 else []
  inner = [o for i in nodes for o in program.nodes[i].outs
           if o not in tainted and program.size(o) == geo.size and _float(program, o)]
  return sorted(inner, key=program.producer.__getitem__)


def group_norm(x, scale, bias, *, groups: int, epsilon: float = 1e-6, activation=None,
               shape: tuple[int, ...] | None = None,
               statistics: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
               mean=None, var=None,
               cotangent=None, grads: tuple[str, ...] = (), dtypes: tuple[str, ...] = (),
               shapes: tuple[tuple[int, ...], ...] = (), pooled: bool = False, **kwargs):
  """`pallas_kernels.group_norm` as the swap calls it (called as the op,
  the op): y shaped as the program held it (with `pooled`, its sum over the
  middle axes instead), and with `statistics` (the program's shapes of them,
  mean's then variance's) the group mean and variance too; with `cotangent`,
  the gradients `grads` names instead ("x", "scale", "bias", and "x_sum":
  dx summed over all but its last axis), from the forward's `mean` and
  `var`, in `dtypes` and `shapes`."""
  from pallas_kernels._src.ops.group_norm import api  # noqa: PLC0415
  common = dict(groups=groups, epsilon=epsilon, activation=activation, **kwargs)
  if cotangent is None:
    shape = jnp.shape(x) if shape is None else shape
    if statistics is None and not pooled:
      return api.group_norm(x, scale, bias, **common).reshape(shape)
    y, mean, var = api.group_norm_with_statistics(x, scale, bias, pooled=pooled, **common)
    y = y.astype(jnp.asarray(x).dtype).reshape(shape)
    return y if statistics is None else (y, mean.reshape(statistics[0]),
                                         var.reshape(statistics[1]))
  got = dict(zip(("x", "scale", "bias", "x_sum"), api.group_norm_backward(
      x, scale, bias, mean, var, cotangent, dx_sum="x_sum" in grads, **common)))
  return tuple(got[k].astype(t).reshape(s) for k, t, s in zip(grads, dtypes, shapes,
                                                                strict=True))
