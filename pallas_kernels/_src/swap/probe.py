"""Regions of a program that act row by row, and what they compute.

Users write a layer norm, a softmax or a GELU in many ways (`x.var()`,
`(x - m) / jnp.sqrt(v + eps)`, `jax.nn.gelu`, a tanh formula...). Rather than
match every spelling, `swap` finds a *region*: the equations reachable from a
start value `h` that only map each row of `h` (its last axis) on its own:
elementwise ops, reductions over the last axis, broadcasts back, and per-column
parameters ([N] vectors such as gamma) and known scalars. Then it *probes* the
region: it replays the region's equations on a one-row stand-in for `h`
(shape parameters rewritten to that row, float converts made identities, all
in float32) and compares the result with each kernel's reference semantics.
A region whose replay equals, say, `layer_norm(h, gamma, beta, eps)` on random
rows, and on a row whose variance is `eps`, computes a layer norm, however it
is spelled.

Every value in a region has a `Kind` (its shape role relative to `h`), which
tells how to shrink its shape for the replay.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from pallas_kernels._src import tolerances
from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap.program import Lit, Node, Program, Val


class Kind(enum.Enum):
  """Shape role of a value relative to the region's start `h` [L..., N]."""

  FULL = "[L..., N]"
  KEEP = "[L..., 1]"
  STAT = "[L...]"
  PARAM = "[N] (or [1.., N])"
  SCALAR = "[] (or [1..])"


#: Elementwise primitives a region may contain (any number of operands).
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "exp", "exp2", "log", "log1p", "expm1",
    "rsqrt", "sqrt", "cbrt", "integer_pow", "pow", "square", "abs", "sign",
    "max", "min", "tanh", "logistic", "erf", "erfc", "erf_inv", "sin", "cos",
    "select_n", "stop_gradient", "convert_element_type", "copy", "copy_p",
    "clamp", "reduce_precision", "eq", "ne", "lt", "le", "gt", "ge", "and",
    "or", "not", "is_finite", "floor", "ceil", "round", "nextafter", "rem",
    "atan2", "optimization_barrier"})
#: Reductions a row region may contain (over the last axis only).
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})
#: Shape ops whose shape parameter the replay rewrites.
SHAPE_OPS = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})
#: Calls replayed through their body (their custom rules do not matter here).
CALLS = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
                   "jit", "pjit", "closed_call"})


class NotRowwise(Exception):
  """The equation does not map rows independently (or cannot be replayed)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Geometry:
  """The region's reference shape: `h` is [L..., N] with rank `rank`."""

  lead: tuple[int, ...]
  n: int

  @property
  def rank(self) -> int:
    return len(self.lead) + 1

  def kind_of(self, shape: tuple[int, ...], row_derived: bool) -> Kind:
    """The kind of a value of `shape` (row-derived: computed from `h`)."""
    r = self.rank
    if row_derived:
      if shape == self.lead + (self.n,):
        return Kind.FULL
      if shape == self.lead + (1,):
        return Kind.KEEP
      if shape == self.lead:
        return Kind.STAT
      raise NotRowwise(f"shape {shape} is not a row shape of {self.lead + (self.n,)}")
    if all(d == 1 for d in shape):
      return Kind.SCALAR
    if shape == (self.n,) or (len(shape) == r and shape[-1] == self.n and
                              all(d == 1 for d in shape[:-1])):
      return Kind.PARAM
    raise NotRowwise(f"shape {shape} is neither a column parameter nor a scalar")

  def probe_shape(self, kind: Kind, shape: tuple[int, ...], width: int) -> tuple[int, ...]:
    """The replay's shape of a value: one row of `width` columns."""
    r = self.rank
    if kind is Kind.FULL:
      return (1,) * (r - 1) + (width,)
    if kind is Kind.KEEP:
      return (1,) * r
    if kind is Kind.STAT:
      return (1,) * (r - 1)
    if kind is Kind.PARAM:
      return shape[:-1] + (width,)
    return shape


@dataclasses.dataclass(frozen=True, slots=True)
class Region:
  """Equations reachable from `start` that act row by row."""

  start: int
  geometry: Geometry
  #: Node indices in program order.
  nodes: tuple[int, ...]
  #: value id -> kind, for `start` and every value the region computes.
  kinds: Mapping[int, Kind]
  #: External operands: value id -> kind (PARAM or SCALAR).
  externals: Mapping[int, Kind]


def _is_float(aval) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.floating)


def grow(program: Program, start: int, *, taken: set[int], elementwise_only: bool,
         limit: int = 256) -> Region:
  """The region of nodes reachable from `start` through row-wise equations.

  Args:
    program: the program.
    start: the value whose rows the region maps.
    taken: nodes other patterns already absorbed (never part of a region).
    elementwise_only: no reductions or shape ops (activation regions).
    limit: at most this many nodes (a region is one layer's work).
  """
  aval = program.avals[start]
  if len(aval.shape) < 1 or aval.shape[-1] < 2:
    raise NotRowwise("the start value has no row axis")
  geo = Geometry(tuple(aval.shape[:-1]), aval.shape[-1])
  kinds: dict[int, Kind] = {start: Kind.FULL}
  externals: dict[int, Kind] = {}
  members: list[int] = []
  first = min(program.uses.get(start, [len(program.nodes)]), default=len(program.nodes))
  for node in program.nodes[first:]:
    if len(members) >= limit:
      break
    if node.index in taken or not any(
        not isinstance(v, Lit) and v in kinds for v in node.ins):
      continue
    try:
      out_kinds, ext = _node_kinds(program, node, geo, kinds, elementwise_only)
    except NotRowwise:
      continue
    members.append(node.index)
    externals.update(ext)
    kinds.update(zip(node.outs, out_kinds))
  return Region(start=start, geometry=geo, nodes=tuple(members),
                kinds=kinds, externals=externals)


def _operand_kind(program: Program, v: Val, geo: Geometry, kinds,
                  ext: dict[int, Kind]) -> Kind:
  if not isinstance(v, Lit) and v in kinds:
    return kinds[v]
  kind = geo.kind_of(tuple(program.aval(v).shape), row_derived=False)
  if kind is Kind.SCALAR and program.value_of(v) is None:
    raise NotRowwise("a traced scalar operand (kernels take Python scalars)")
  if not isinstance(v, Lit):
    ext[v] = kind
  return kind


def _node_kinds(program: Program, node: Node, geo: Geometry, kinds,
                elementwise_only: bool) -> tuple[list[Kind], dict[int, Kind]]:
  """Kinds of `node`'s outputs, and the external operands it reads."""
  ext: dict[int, Kind] = {}
  in_kinds = [_operand_kind(program, v, geo, kinds, ext) for v in node.ins]
  prim = node.prim
  out_avals = [program.avals[o] for o in node.outs]
  if prim in ELEMENTWISE:
    if elementwise_only and any(k not in (Kind.FULL, Kind.SCALAR) for k in in_kinds):
      raise NotRowwise("an activation takes no column parameters")
    return [geo.kind_of(tuple(a.shape), True) for a in out_avals], ext
  if prim in CALLS:
    body = _body(node.eqn)
    if body is None or any(isinstance(c, jax.core.Tracer) for c in body.consts):
      raise NotRowwise(f"{prim} without a replayable body")
    inner = dict(zip(body.jaxpr.invars, in_kinds))
    _jaxpr_kinds(body.jaxpr, geo, inner, elementwise_only)
    return [inner[v] if not isinstance(v, jex_core.Literal) else Kind.SCALAR
            for v in body.jaxpr.outvars], ext
  if elementwise_only:
    raise NotRowwise(f"{prim} is not elementwise")
  if prim in REDUCTIONS:
    axes = tuple(node.params["axes"])
    if axes != (geo.rank - 1,) or in_kinds[0] is not Kind.FULL:
      raise NotRowwise(f"{prim} over axes {axes}, not the last axis")
    return [Kind.STAT], ext
  if prim in SHAPE_OPS:
    return [geo.kind_of(tuple(a.shape), True) for a in out_avals], ext
  raise NotRowwise(f"{prim} is not row-wise")


def _body(eqn) -> jex_core.ClosedJaxpr | None:
  for key in ("call_jaxpr", "jaxpr", "fun_jaxpr"):
    j = eqn.params.get(key)
    if isinstance(j, jex_core.ClosedJaxpr):
      return j
    if isinstance(j, jex_core.Jaxpr):
      return jex_core.ClosedJaxpr(j, ())
  return None


def _jaxpr_kinds(jaxpr, geo: Geometry, kinds: dict, elementwise_only: bool) -> None:
  """Kinds of a call body's values (raises NotRowwise where it is not)."""
  for v in jaxpr.constvars:
    kinds[v] = geo.kind_of(tuple(v.aval.shape), False)
  for eqn in jaxpr.eqns:
    # A literal is a scalar (jaxprs hold no array literals).
    in_kinds = [Kind.SCALAR if isinstance(v, jex_core.Literal) else kinds[v]
                for v in eqn.invars]
    row = any(k in (Kind.FULL, Kind.KEEP, Kind.STAT) for k in in_kinds)
    prim = eqn.primitive.name
    if prim in ELEMENTWISE or prim in SHAPE_OPS:
      if prim in SHAPE_OPS and elementwise_only:
        if row:
          raise NotRowwise(f"{prim} in an activation")
      for o in eqn.outvars:
        kinds[o] = geo.kind_of(tuple(o.aval.shape), row)
    elif prim in REDUCTIONS and not elementwise_only:
      if tuple(eqn.params["axes"]) != (geo.rank - 1,):
        raise NotRowwise("reduction over another axis")
      kinds[eqn.outvars[0]] = Kind.STAT
    elif prim in CALLS:
      body = _body(eqn)
      if body is None:
        raise NotRowwise(prim)
      inner = dict(zip(body.jaxpr.invars, in_kinds))
      _jaxpr_kinds(body.jaxpr, geo, inner, elementwise_only)
      for o, v in zip(eqn.outvars, body.jaxpr.outvars):
        kinds[o] = Kind.SCALAR if isinstance(v, jex_core.Literal) else inner[v]
    else:
      raise NotRowwise(f"{prim} is not row-wise")


def cone(program: Program, region: Region, out: int) -> tuple[int, ...] | None:
  """Region nodes needed for `out`, if its intermediates are used by those
  nodes only (so a kernel computing `out` makes them all dead); else None."""
  members = set(region.nodes)
  need: set[int] = set()
  stack = [out]
  seen = set()
  while stack:
    v = stack.pop()
    if v in seen or v == region.start:
      continue
    seen.add(v)
    p = program.producer.get(v)
    if p is None or p not in members:
      continue
    need.add(p)
    stack.extend(x for x in program.nodes[p].ins if not isinstance(x, Lit))
  for i in need:
    for o in program.nodes[i].outs:
      if o == out:
        continue
      if o in program.returned or any(u not in need for u in program.uses.get(o, ())):
        return None
  return tuple(sorted(need))


def replay(program: Program, region: Region, inputs: Mapping[int, np.ndarray],
           width: int) -> dict[int, np.ndarray]:
  """Evaluates the region's nodes on one-row probe `inputs` (value id ->
  array), in float32 with float converts as identities.

  Returns every value computed; stops at the first node that cannot be
  replayed (its results, and those of nodes after it, are then missing).
  """
  geo = region.geometry
  env: dict[Any, Any] = dict(inputs)

  def read(v: Val):
    if isinstance(v, Lit):
      return _f32(np.asarray(v.value))
    if v in env:
      return env[v]
    known = program.value_of(v)
    if known is None:
      raise NotRowwise(f"no probe value for operand {v}")
    return _f32(np.asarray(known))

  with prog_lib.eager_here():
    for i in region.nodes:
      node = program.nodes[i]
      try:
        invals = [read(v) for v in node.ins]
        out_shapes = [geo.probe_shape(region.kinds[o], tuple(program.avals[o].shape), width)
                      for o in node.outs]
        outs = _replay_eqn(node.eqn, invals, out_shapes, geo, width)
      except (NotRowwise, TypeError, ValueError, KeyError):
        break
      env.update(zip(node.outs, (np.asarray(o) for o in outs)))
  return env


def _f32(x: np.ndarray) -> np.ndarray:
  """Probes compute in float32 (integers too: the op's guard, not the probe,
  decides whether an integer pattern can run)."""
  if jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer):
    return x.astype(np.float32)
  return x


def _replay_eqn(eqn, invals, out_shapes, geo: Geometry, width: int) -> list:
  prim = eqn.primitive.name
  params = dict(eqn.params)
  if prim == "convert_element_type":
    new = jnp.dtype(params["new_dtype"])
    if jnp.issubdtype(new, jnp.floating) or jnp.issubdtype(new, jnp.integer):
      return [_f32(np.asarray(invals[0]))]
  if prim in ("reduce_precision",):
    return [invals[0]]
  if prim == "broadcast_in_dim":
    params["shape"] = out_shapes[0]
    if "sharding" in params:
      params["sharding"] = None
    return [jax.lax.broadcast_in_dim(invals[0], out_shapes[0],
                                     params["broadcast_dimensions"])]
  if prim == "reshape":
    return [jnp.reshape(invals[0], out_shapes[0])]
  if prim == "expand_dims":
    return [jnp.reshape(invals[0], out_shapes[0])]
  if prim in CALLS:
    body = _body(eqn)
    return _replay_jaxpr(body, invals, geo, width)
  out = prog_lib.bind(eqn, invals, params)
  return list(out) if eqn.primitive.multiple_results else [out]


def _replay_jaxpr(closed: jex_core.ClosedJaxpr, invals, geo: Geometry, width: int) -> list:
  jaxpr = closed.jaxpr
  kinds: dict = {}
  for v, x in zip(jaxpr.invars, invals):
    kinds[v] = _kind_of_probe(np.shape(x), geo, v.aval)
  _jaxpr_kinds(jaxpr, geo, kinds, elementwise_only=False)
  env: dict = dict(zip(jaxpr.invars, invals))
  env.update((v, _f32(np.asarray(c))) for v, c in zip(jaxpr.constvars, closed.consts))

  def read(v):
    return _f32(np.asarray(v.val)) if isinstance(v, jex_core.Literal) else env[v]

  for eqn in jaxpr.eqns:
    out_shapes = [geo.probe_shape(kinds[o], tuple(o.aval.shape), width) for o in eqn.outvars]
    outs = _replay_eqn(eqn, [read(v) for v in eqn.invars], out_shapes, geo, width)
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def _kind_of_probe(probe_shape, geo: Geometry, aval) -> Kind:
  """Recovers the kind of a call argument from its original shape."""
  shape = tuple(aval.shape)
  for row in (True, False):
    try:
      return geo.kind_of(shape, row)
    except NotRowwise:
      continue
  raise NotRowwise(f"call operand of shape {shape}")


# ----------------------------------------------------------- references ----


def _softmax(h):
  e = np.exp(h - h.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _layer_norm(h, gamma, beta, eps):
  mean = h.mean(-1, keepdims=True)
  var = ((h - mean) ** 2).mean(-1, keepdims=True)
  y = (h - mean) / np.sqrt(var + eps)
  return y * gamma + beta


def _rms_norm(h, gamma, eps):
  return h / np.sqrt((h ** 2).mean(-1, keepdims=True) + eps) * gamma


def _rel_err(out, ref) -> float:
  out = np.asarray(out, np.float64).ravel()
  ref = np.asarray(ref, np.float64).ravel()
  if out.shape != ref.shape or not np.all(np.isfinite(out)):
    return float("inf")
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def _within(err: float, tol: float) -> bool:
  return err <= tol


def _agrees(out, ref, tol: float) -> bool:
  """`out` is `ref` within relative error `tol` (and finite)."""
  return _within(_rel_err(out, ref), tol)


#: Probes agree with a reference within this relative error (float32 math;
#: reductions reassociate).
ROW_TOL = 2e-5
#: The largest constant a norm's epsilon is read off from (its other
#: constants, 0.5 or 1/n, are larger).
MAX_EPS = 0.1


def epsilon_as_written(value) -> float | None:
  """A scalar constant as the user wrote it (1e-06, not float32's
  9.99999997e-07), if it can be a norm's epsilon; else None. Compared as
  written: 0.1 held in float32 is past 0.1."""
  written = float(str(np.asarray(value)[()]))
  return written if 0.0 < written <= MAX_EPS else None
#: Activations are probed point by point: tanh-GELU differs from exact GELU
#: by ~1e-4 relatively, far above float32 rounding.
ELEMENTWISE_TOL = 2e-6


@dataclasses.dataclass(frozen=True, slots=True)
class RowOp:
  """What a row region computes."""

  #: "softmax", "layer_norm" or "rms_norm".
  op: str
  eps: float = 0.0
  #: External PARAM values used as gamma and beta (None: not present).
  gamma: int | None = None
  beta: int | None = None


class RowProbe:
  """Replays of one row region on probe rows, shared by its candidates."""

  def __init__(self, program: Program, region: Region, seed: int = 0):
    self.program = program
    self.region = region
    n = region.geometry.n
    rng = np.random.default_rng(seed)
    self.rows = [rng.normal(0.3, 1.3, n).astype(np.float32),
                 rng.normal(-1.0, 0.5, n).astype(np.float32)]
    self.params = {v: rng.normal(0.2, 1.0, tuple(program.avals[v].shape)).astype(np.float32)
                   for v, k in region.externals.items() if k is Kind.PARAM}
    self._envs: dict[Any, dict[int, np.ndarray]] = {}

  def env(self, key, row: np.ndarray) -> dict[int, np.ndarray]:
    if key not in self._envs:
      geo = self.region.geometry
      inputs = {self.region.start: row.reshape(geo.probe_shape(Kind.FULL, (), geo.n))}
      inputs.update(self.params)
      self._envs[key] = replay(self.program, self.region, inputs, geo.n)
    return self._envs[key]

  def classify(self, nodes: Sequence[int], out: int) -> RowOp | None:
    """The kernel op the region computes from its start to `out`, if any."""
    program = self.program
    if not any(program.nodes[i].prim in REDUCTIONS or program.nodes[i].prim in CALLS
               for i in nodes):
      return None
    used = {v for i in nodes for v in program.nodes[i].ins if not isinstance(v, Lit)}
    params = [v for v in self.params if v in used]
    if len(params) > 2:
      return None
    scalars = {float(np.asarray(program.value_of(v)).reshape(())) for i in nodes
               for v in program.nodes[i].ins
               if program.value_of(v) is not None and np.size(program.value_of(v)) == 1}
    eps_candidates = sorted({e for e in map(epsilon_as_written, map(np.float32, scalars))
                             if e is not None}) or [0.0]
    outs = [self.env(k, r).get(out) for k, r in enumerate(self.rows)]
    if any(o is None for o in outs):
      return None
    outs = [o.ravel() for o in outs]
    rows = [r.astype(np.float64) for r in self.rows]
    if all(_agrees(o, _softmax(r), ROW_TOL) for o, r in zip(outs, rows)):
      return RowOp("softmax")
    n = self.region.geometry.n
    ones, zeros = np.ones(n), np.zeros(n)

    def vec(p):
      return ones if p is None else self.params[p].ravel().astype(np.float64)

    if len(params) == 2:
      ln_assign, rms_assign = [tuple(params), tuple(params[::-1])], []
    elif len(params) == 1:
      ln_assign, rms_assign = [(params[0], None), (None, params[0])], [params[0]]
    else:
      ln_assign, rms_assign = [(None, None)], [None]
    for eps in eps_candidates:
      probes = list(zip(outs, rows))
      if eps > 0:
        # A row whose variance (and mean square) is eps makes eps visible.
        tiny = (np.sqrt(eps) * np.where(np.arange(n) % 2, 1.0, -1.0)).astype(np.float32)
        tiny_out = self.env(("eps", eps), tiny).get(out)
        if tiny_out is None:
          return None
        probes.append((tiny_out.ravel(), tiny.astype(np.float64)))
      for g, b in ln_assign:
        bv = zeros if b is None else vec(b)
        if all(_agrees(o, _layer_norm(r, vec(g), bv, eps), ROW_TOL) for o, r in probes):
          return RowOp("layer_norm", eps=eps, gamma=g, beta=b)
      for g in rms_assign:
        if all(_agrees(o, _rms_norm(r, vec(g), eps), ROW_TOL) for o, r in probes):
          return RowOp("rms_norm", eps=eps, gamma=g)
    return None


def _precision(dtype) -> float:
  """Relative rounding of a float dtype (0 for float32 and wider, and for
  non-float dtypes)."""
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.floating) or jnp.finfo(dtype).nmant >= 23:
    return 0.0
  return tolerances.tolerance(dtype)


_erf = np.vectorize(math.erf, otypes=[np.float64])

#: Activation names the matmul kernel takes, with float64 references.
_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) *
                                                    (x + 0.044715 * x ** 3))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
}


@dataclasses.dataclass(frozen=True, slots=True)
class PointOp:
  """What an elementwise region computes: an activation, then a clamp."""

  activation: str | None = None
  clamp: tuple[float | None, float | None] | None = None


#: Probe points of elementwise regions: dense where activations differ.
_POINTS = np.concatenate([np.linspace(-8.0, 8.0, 321), [-40.0, -20.0, 20.0, 40.0]])


class PointProbe:
  """One replay of an elementwise region on probe points, shared by its
  candidate outputs."""

  def __init__(self, program: Program, region: Region):
    self.program = program
    self.region = region
    self.x = _POINTS.astype(np.float32)
    width = self.x.size
    inputs = {region.start: self.x.reshape(region.geometry.probe_shape(Kind.FULL, (), width))}
    self.env = replay(program, region, inputs, width)

  def classify(self, nodes: Sequence[int], out: int) -> PointOp | None:
    """The activation and/or clamp computed from the start to `out`, if any."""
    y = self.env.get(out)
    if not nodes or y is None:
      return None
    y = y.ravel()
    program = self.program
    consts = sorted({float(np.asarray(program.value_of(v)).reshape(()))
                     for i in nodes for v in program.nodes[i].ins
                     if program.value_of(v) is not None and
                     np.size(program.value_of(v)) == 1})
    x64 = self.x.astype(np.float64)
    # Low-precision regions round their constants too (bf16 GELU's 0.044715).
    tol = max([ELEMENTWISE_TOL] + [_precision(program.avals[o].dtype)
                                   for i in nodes for o in program.nodes[i].outs])
    # The closest activation (tanh-GELU and exact GELU may both agree in bf16).
    errors = {name: _rel_err(y, fn(x64)) for name, fn in _ACTIVATIONS.items()}
    closest = min(errors, key=errors.__getitem__)
    if _within(errors[closest], tol):
      return PointOp(activation=closest)
    bounds = [None] + [c for c in consts if np.isfinite(c)]
    for lo in bounds:
      for hi in bounds:
        if (lo is None and hi is None) or (lo is not None and hi is not None and lo > hi):
          continue
        if _agrees(y, np.clip(x64, lo, hi), tol):
          return PointOp(clamp=(lo, hi))
        for name, fn in _ACTIVATIONS.items():
          if _agrees(y, np.clip(fn(x64), lo, hi), tol):
            return PointOp(activation=name, clamp=(lo, hi))
    return None
