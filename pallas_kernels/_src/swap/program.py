"""A traced function as a flat graph for matching, and its evaluator.

`build` turns a `ClosedJaxpr` into a `Program`: every value gets an integer
id, nested `jit` calls are inlined (a pattern may start in the caller and end
in a callee, e.g. `jnp.where` is a jitted helper), and every other equation is
one `Node`. Control flow and custom-derivative calls (scan, while, cond,
remat, custom_jvp/custom_vjp) stay single nodes; `swap` rewrites their bodies
as programs of their own.

`evaluate` runs a program under the caller's trace (jit, grad, vmap, a scan
body...) equation by equation, as `jax.core.eval_jaxpr` does, except where a
`Plan` says to emit a kernel call, skip an equation the kernel absorbed, or
run a rewritten body. A `jit` call none of whose equations the plan touches is
bound whole, so the user's jit boundaries survive where nothing changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core
from jax.extend import source_info_util

#: Primitive names of inlinable jit calls across jax versions.
JIT_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call"})
#: Constant-fold values at most this large (elements), e.g. causal masks.
FOLD_LIMIT = 1 << 22


@dataclasses.dataclass(frozen=True, slots=True)
class Lit:
  """A literal operand (a Python or NumPy scalar baked into the jaxpr)."""

  value: Any
  aval: Any


#: An operand: a value id or a literal.
Val = int | Lit


@dataclasses.dataclass(eq=False, slots=True)
class Node:
  """One equation of the flattened program."""

  index: int
  eqn: Any
  ins: tuple[Val, ...]
  outs: tuple[int, ...]

  @property
  def prim(self) -> str:
    return self.eqn.primitive.name

  @property
  def params(self) -> Mapping[str, Any]:
    return self.eqn.params


@dataclasses.dataclass(eq=False, slots=True)
class CallSite:
  """An inlined `jit` call: bound whole unless the plan touches its body."""

  eqn: Any
  ins: tuple[Val, ...]
  #: The call's results: the body's output operands.
  outs: tuple[Val, ...]
  #: The call's own result ids (`outs` aliases them in the graph).
  items: tuple[Node | CallSite, ...]
  #: Indices of every node inside, nested calls included.
  nodes: frozenset[int]


@dataclasses.dataclass(eq=False, slots=True)
class Program:
  """A flattened jaxpr: nodes in topological order, values by id."""

  nodes: list[Node]
  items: tuple[Node | CallSite, ...]
  invars: tuple[int, ...]
  constvars: tuple[int, ...]
  consts: tuple[Any, ...]
  outs: tuple[Val, ...]
  #: value id -> abstract value.
  avals: dict[int, Any]
  #: value id -> index of the node that computes it.
  producer: dict[int, int]
  #: value id -> indices of the nodes reading it (each once).
  uses: dict[int, list[int]]
  #: Values the program returns.
  returned: frozenset[int]
  #: Concrete values known while tracing (consts and what folds from them).
  known: dict[int, Any]
  #: Constants of inlined jit calls: value id -> value.
  call_consts: dict[int, Any] = dataclasses.field(default_factory=dict)
  #: Program inputs the traced function's own jit donates (its
  #: `donated_invars`): an update may write over them in place.
  donated: frozenset[int] = frozenset()

  def aval(self, v: Val):
    return v.aval if isinstance(v, Lit) else self.avals[v]

  def size(self, v: Val) -> int:
    """Elements of an operand."""
    return math.prod(self.aval(v).shape)

  def value_of(self, v: Val) -> Any | None:
    """The concrete value of an operand, or None when it is only traced."""
    if isinstance(v, Lit):
      return v.value
    return self.known.get(v)

  def node_of(self, v: Val) -> Node | None:
    """The node computing `v` (None for literals, inputs and constants)."""
    if isinstance(v, Lit) or v not in self.producer:
      return None
    return self.nodes[self.producer[v]]

  def single_use(self, v: Val) -> Node | None:
    """The only node reading `v`, when there is exactly one and `v` is not
    returned; else None."""
    if isinstance(v, Lit) or v in self.returned:
      return None
    users = self.uses.get(v, [])
    return self.nodes[users[0]] if len(users) == 1 else None


def _is_jit_call(eqn) -> bool:
  return (eqn.primitive.name in JIT_PRIMITIVES and
          isinstance(eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")),
                     (jex_core.ClosedJaxpr, jex_core.Jaxpr)))


def _closed(j) -> jex_core.ClosedJaxpr:
  return j if isinstance(j, jex_core.ClosedJaxpr) else jex_core.ClosedJaxpr(j, ())


def build(closed: jex_core.ClosedJaxpr) -> Program:
  """Flattens `closed` (inlining jit calls) into a `Program`."""
  nodes: list[Node] = []
  avals: dict[int, Any] = {}
  known: dict[int, Any] = {}
  call_consts: dict[int, Any] = {}
  counter = iter(range(1 << 62))

  def fresh(aval) -> int:
    i = next(counter)
    avals[i] = aval
    return i

  def operand(v, env) -> Val:
    if isinstance(v, jex_core.Literal):
      return Lit(v.val, v.aval)
    return env[v]

  def walk(jaxpr, env, out_items: list) -> None:
    for eqn in jaxpr.eqns:
      ins = tuple(operand(v, env) for v in eqn.invars)
      if _is_jit_call(eqn):
        inner = _closed(eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")))
        inner_env: dict = {}
        for cv, c in zip(inner.jaxpr.constvars, inner.consts):
          inner_env[cv] = fresh(cv.aval)
          call_consts[inner_env[cv]] = c
          if not isinstance(c, jax.core.Tracer):
            known[inner_env[cv]] = c
        for iv, a in zip(inner.jaxpr.invars, ins):
          inner_env[iv] = a
        start = len(nodes)
        sub_items: list = []
        walk(inner.jaxpr, inner_env, sub_items)
        outs = tuple(operand(v, inner_env) for v in inner.jaxpr.outvars)
        for ov, a in zip(eqn.outvars, outs):
          env[ov] = a
        out_items.append(CallSite(eqn=eqn, ins=ins, outs=outs, items=tuple(sub_items),
                                  nodes=frozenset(range(start, len(nodes)))))
        continue
      outs = []
      for ov in eqn.outvars:
        i = fresh(ov.aval)
        env[ov] = i
        outs.append(i)
      node = Node(index=len(nodes), eqn=eqn, ins=ins, outs=tuple(outs))
      nodes.append(node)
      out_items.append(node)

  env: dict = {}
  constvars = []
  for cv, c in zip(closed.jaxpr.constvars, closed.consts):
    env[cv] = fresh(cv.aval)
    constvars.append(env[cv])
    if not isinstance(c, jax.core.Tracer):
      known[env[cv]] = c
  invars = []
  for iv in closed.jaxpr.invars:
    env[iv] = fresh(iv.aval)
    invars.append(env[iv])
  items: list = []
  walk(closed.jaxpr, env, items)
  # A jitted function traced whole is one call at the top: what it donates.
  donated = frozenset(
      a for item in items if isinstance(item, CallSite)
      for a, d in zip(item.ins, item.eqn.params.get("donated_invars", ()))
      if d and not isinstance(a, Lit) and a in invars)
  outs = tuple(operand(v, env) for v in closed.jaxpr.outvars)
  producer = {o: n.index for n in nodes for o in n.outs}
  uses: dict[int, list[int]] = {}
  for n in nodes:
    for v in dict.fromkeys(v for v in n.ins if not isinstance(v, Lit)):
      uses.setdefault(v, []).append(n.index)
  program = Program(
      nodes=nodes, items=tuple(items), invars=tuple(invars),
      constvars=tuple(constvars), consts=tuple(closed.consts), outs=outs,
      avals=avals, producer=producer, uses=uses,
      returned=frozenset(v for v in outs if not isinstance(v, Lit)), known=known,
      call_consts=call_consts, donated=donated)
  _fold_constants(program)
  return program


def _fold_constants(program: Program) -> None:
  """Evaluates, while tracing, the nodes whose inputs are all known (iota
  masks, converted literals), so patterns can read masks and scalars."""
  for node in program.nodes:
    if node.eqn.effects or any(True for _ in jex_core.jaxprs_in_params(node.params)):
      continue
    vals = [program.value_of(v) for v in node.ins]
    if any(v is None for v in vals):
      continue
    if sum(int(np.prod(program.avals[o].shape)) for o in node.outs) > FOLD_LIMIT:
      continue
    if any(jax.dtypes.issubdtype(program.avals[o].dtype, jax.dtypes.extended)
           for o in node.outs):
      continue  # A PRNG key (flax's LSTM splits one): no NumPy form, no pattern reads it.
    try:
      with jax.ensure_compile_time_eval():
        out = bind(node.eqn, vals)
    except Exception:  # noqa: BLE001 - folding is an optimization only
      continue
    outs = out if node.eqn.primitive.multiple_results else [out]
    for o, v in zip(node.outs, outs):
      program.known[o] = np.asarray(v)


@contextlib.contextmanager
def eager_here():
  """Equations bound inside run now, on this CPU, whatever trace the swap
  runs under (a jit, a grad, a GPU target): how the matchers replay a
  program's equations on test values."""
  with jax.ensure_compile_time_eval(), jax.default_device(jax.devices("cpu")[0]):
    yield


def bind(eqn, invals: Sequence[Any], params: Mapping[str, Any] | None = None,
         source_info=None) -> Any:
  """Binds `eqn`'s primitive to `invals` (as `jax.core.eval_jaxpr` does),
  with the user's source location so HLO metadata keeps pointing at it."""
  params = eqn.params if params is None else params
  bind_params = eqn.primitive.get_bind_params(params)
  info = eqn.source_info if source_info is None else source_info
  name_stack = source_info_util.current_name_stack() + info.name_stack
  ctx = getattr(getattr(eqn, "ctx", None), "manager", None)
  with source_info_util.user_context(info.traceback, name_stack=name_stack):
    if ctx is not None:
      with ctx:
        return _bind(eqn.primitive, bind_params, invals)
    return _bind(eqn.primitive, bind_params, invals)


def _bind(primitive, bind_params, invals):
  if isinstance(bind_params, tuple):  # Older jax: (subfuns, params).
    subfuns, bind_params = bind_params
    return primitive.bind(*subfuns, *invals, **bind_params)
  return primitive.bind(*invals, **bind_params)


@dataclasses.dataclass(eq=False, slots=True)
class Plan:
  """What to change when evaluating a program."""

  #: node index -> callables run just before that node (len(nodes): at the
  #: end); each takes `read` and returns {value id: value}.
  emit_before: dict[int, list[Callable[[Callable[[Val], Any]], dict[int, Any]]]]
  #: Nodes whose work an emitted kernel does.
  skip: set[int]
  #: node index -> evaluator of a node whose bodies were rewritten.
  rewritten: dict[int, Callable[[list[Any]], list[Any]]]

  @property
  def touched(self) -> set[int]:
    return self.skip | set(self.emit_before) | set(self.rewritten)

  @property
  def empty(self) -> bool:
    return not (self.emit_before or self.skip or self.rewritten)


def evaluate(program: Program, plan: Plan, args: Sequence[Any],
             consts: Sequence[Any] | None = None) -> list[Any]:
  """Runs `program` on `args` (flat, matching its invars) under `plan`."""
  env: dict[int, Any] = dict(program.call_consts)
  consts = program.consts if consts is None else consts
  for i, c in zip(program.constvars, consts):
    env[i] = c
  for i, a in zip(program.invars, args):
    env[i] = a
  touched = plan.touched

  def read(v: Val) -> Any:
    return v.value if isinstance(v, Lit) else env[v]

  def emit(index: int) -> None:
    for fn in plan.emit_before.get(index, ()):
      env.update(fn(read))

  def run_items(items) -> None:
    for item in items:
      if isinstance(item, CallSite):
        if item.nodes & touched:
          run_items(item.items)
        else:
          out = bind(item.eqn, [read(v) for v in item.ins])
          for v, val in zip(item.outs, out):
            if not isinstance(v, Lit) and v not in env:
              env[v] = val
        continue
      emit(item.index)
      if item.index in plan.skip:
        continue
      invals = [read(v) for v in item.ins]
      if item.index in plan.rewritten:
        out = plan.rewritten[item.index](invals)
      else:
        out = bind(item.eqn, invals)
        if not item.eqn.primitive.multiple_results:
          out = [out]
      for o, val in zip(item.outs, out):
        env[o] = val

  run_items(program.items)
  emit(len(program.nodes))
  return [read(v) for v in program.outs]
