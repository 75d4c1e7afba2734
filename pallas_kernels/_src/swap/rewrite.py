"""`swap`: run a function with its fusible patterns replaced by kernel calls.

The swapped function traces the user's function to a jaxpr (`jax.make_jaxpr`)
at each new input signature, flattens it (`program.build`), plans the
replacements (`plan_program`: anchors in program order, each pattern checked
by its op's own guard in a dry run) and evaluates the program under the
caller's trace, calling the kernels' public API at each replaced pattern. Only
the values change hands, so `jax.jit`, `jax.grad` (the kernels' custom VJPs),
`jax.vmap` (the kernels' batching rules) and control flow compose with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.extend import source_info_util

from pallas_kernels._src import backend
from pallas_kernels._src import compat
from pallas_kernels._src import jax_attention
from pallas_kernels._src.swap import activation_grad
from pallas_kernels._src.swap import adam
from pallas_kernels._src.swap import attention
from pallas_kernels._src.swap import column_sum
from pallas_kernels._src.swap import cross_entropy
from pallas_kernels._src.swap import glu
from pallas_kernels._src.swap import group_norm
from pallas_kernels._src.swap import guard_check
from pallas_kernels._src.swap import hoist as hoist_lib
from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap.patterns import Match, Rejection
from pallas_kernels._src.swap.program import Lit, Plan, Program
from pallas_kernels._src.swap.report import SwapReport, SwapSite

#: The report's name for work the swap moved out of a loop (no kernel).
HOISTED = "hoisted out of the loop"


#: Anchor primitive -> matchers, tried in order: a weight gradient feeding
#: Adam's update, a gemm starting an attention chain, a GLU or a
#: cross-entropy head is the chain's before it is a matmul's; so is a gemm
#: whose result an activation's derivative multiplies, and a weight
#: gradient beside its bias gradient's sum (a backward pass). A sum over a
#: grouped view of x is a group norm's before it is a row op's.
_MATCHERS = {**patterns.REGISTRY, "dot_general": (
    adam.match_adam, attention.match_attention, glu.match_glu, cross_entropy.match_cross_entropy,
    activation_grad.match_activation_grad, column_sum.match_column_sum,
    *patterns.REGISTRY["dot_general"]),
    "reduce_sum": (group_norm.match_group_norm, *patterns.REGISTRY["reduce_sum"])}


def _ops() -> dict[str, Callable[..., Any]]:
  """The ops swap can use, by name (`ops=` takes these); the matchers in
  `patterns.REGISTRY` say which of them a program's equations become."""
  return guard_check.op_functions()


# --------------------------------------------------------------- sites ----


def _frame(source_info) -> tuple[str, int, str]:
  """(file, line, "file:line (function)") of the user's frame."""
  text = source_info_util.summarize(source_info)
  if not text or text == "unknown":
    return "", 0, ""
  loc, _, fn = text.partition(" (")
  parts = loc.rsplit(":", 2)
  # "file:line:col" or "file:line".
  if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
    file, line = parts[0], int(parts[1])
  elif len(parts) >= 2 and parts[-1].isdigit():
    file, line = ":".join(parts[:-1]), int(parts[-1])
  else:
    return "", 0, text
  return file, line, f"{file}:{line}" + (f" ({fn.rstrip(')')})" if fn else "")


def _public_name(op: str) -> str:
  """The public call an op name stands for ("attention" is JAX's own)."""
  return jax_attention.ATTENTION if op == attention.OP else f"pallas_kernels.{op}"


def _pattern_text(op: str, items: Sequence[str]) -> str:
  anchor = {"matmul": "dot_general", attention.OP: "gemm -> softmax -> gemm",
            adam.OP: "weight gradient dot_general"}.get(op, op)
  return " + ".join([anchor, *(i for i in items if i != "statistics")])


def _call_text(program: Program, op: str, operands, static) -> str:
  parts = [f"{k}={o.describe(program)}" for k, o in operands]
  for k, v in static:
    if k in ("out_dtype", "layout"):
      continue
    parts.append(f"{k}={v!r}")
  return f"{op}({', '.join(parts)})"


def _site(program: Program, result: Match | Rejection, replaced: bool, reason: str,
          where: str) -> SwapSite:
  anchor = program.nodes[result.anchor]
  _, _, source = _frame(anchor.eqn.source_info)
  locations = []
  for i in sorted(result.consumed | {result.anchor}):
    file, line, _ = _frame(program.nodes[i].eqn.source_info)
    if file and (file, line) not in locations:
      locations.append((file, line))
  if isinstance(result, Match):
    call = _call_text(program, result.op, result.positional + result.keywords, result.static)
    output = ", ".join(patterns.describe_aval(program.avals[o]) for o in result.outputs)
  else:
    call = f"{result.op}(...)"
    output = ", ".join(patterns.describe_aval(program.avals[o])
                       for o in program.nodes[result.anchor].outs)
  return SwapSite(kernel=_public_name(result.op),
                  pattern=_pattern_text(result.op, result.items), call=call,
                  output=output, source=source, where=where, replaced=replaced,
                  reason=reason, locations=tuple(locations))


# ------------------------------------------------------------- dry run ----

def _dry_run(program: Program, match: Match, interpret: bool | None) -> str | None:
  """Why the op would not run this call as a kernel (its guard's reason, an
  invalid call, or a result unlike the program's), or None."""
  positional = [o.abstract(program) for _, o in match.positional]
  keywords = {k: o.abstract(program) for k, o in match.keywords}
  reason, out = guard_check.dry_run(match.op, positional, keywords, dict(match.static),
                                    interpret)
  if reason is not None:
    return reason
  want = tuple((tuple(program.avals[o].shape), jnp.dtype(program.avals[o].dtype).name)
               for o in match.outputs)
  got = tuple((tuple(o.shape), jnp.dtype(w[1] if _side_cast(i, o.dtype, w[1]) else o.dtype).name)
              for i, (o, w) in enumerate(zip(jax.tree.leaves(out), want)))
  if got != want:
    return f"the kernel's result {got} differs from the program's {want}"
  return None


def _side_cast(i: int, got, want) -> bool:
  """Whether output `i` of a call is a side output the kernel writes in
  float32 (a column sum) where the program computed it in a narrower float:
  cast to the program's type, as its own sum rounds."""
  return (i > 0 and jnp.dtype(got) == jnp.float32 and jnp.dtype(want) != jnp.float32 and
          jnp.issubdtype(jnp.dtype(want), jnp.floating))


def _emitter(program: Program, match: Match, interpret: bool | None):
  fn = _ops()[match.op]
  # Left to the op: it builds for `swap`'s `target=` (the targeting scope),
  # else for its operands' device, else -- on a CPU-only machine, where only
  # the lowering knows -- for this CPU and the GPUs it defers to, the lowering
  # keeping one (so one swapped function runs here and compiles for an H200).
  static = dict(match.static, implementation="pallas", interpret=interpret)
  info = program.nodes[match.anchor].eqn.source_info

  def emit(read) -> dict[int, Any]:
    pos = [o.resolve(read) for _, o in match.positional]
    kw = {k: o.resolve(read) for k, o in match.keywords}
    name_stack = source_info_util.current_name_stack() + info.name_stack
    # The kernel's HLO metadata names the user's line, not this module.
    with source_info_util.user_context(info.traceback, name_stack=name_stack):
      out = fn(*pos, **kw, **static)
    outs = out if isinstance(out, tuple) else (out,)
    return {v: o.astype(program.avals[v].dtype)
            if _side_cast(i, o.dtype, program.avals[v].dtype) else o
            for i, (v, o) in enumerate(zip(match.outputs, outs))}

  return emit


def _emission_point(program: Program, match: Match) -> int | None:
  """The node before which the call runs: after its last input is computed
  and before the first outside use of a result; None if there is none."""
  inputs = [o.val for o in match.operands() if o.val is not None and
            not isinstance(o.val, Lit)]
  ready = max((program.producer.get(v, -1) for v in inputs), default=-1)
  point = max(match.consumed) + 1
  for out in match.outputs:
    for u in program.uses.get(out, ()):
      if u not in match.consumed:
        point = min(point, u)
  return point if point > ready else None


# ----------------------------------------------------------- planning ----


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
  ops: frozenset[str]
  interpret: bool | None


def plan_program(program: Program, options: _Options, where: str,
                 sites: list[SwapSite]) -> Plan:
  """Chooses the replacements in `program` (and in its bodies)."""
  taken: set[int] = set()
  # Values the accepted calls write; any other value of a taken node is gone.
  written: set[int] = set()
  emit: dict[int, list[tuple[int, Callable]]] = {}
  rewritten: dict[int, Callable] = {}
  for node in program.nodes:
    if node.index in taken:
      continue
    body = _plan_bodies(node, options, where, sites)
    if body is not None:
      rewritten[node.index] = body
    for matcher in _MATCHERS.get(node.prim, ()):
      result = matcher(program, node, taken)
      if result is None:
        continue
      if isinstance(result, Rejection):
        sites.append(_site(program, result, False, result.reason, where))
        break
      follow = () if result.follow is None else result.follow.operands()
      inputs = [o.val for o in result.operands() + follow if o.val is not None and
                not isinstance(o.val, Lit)]
      if any(program.producer.get(v) in taken and v not in written for v in inputs):
        continue  # It reads what an earlier call absorbed: the next pattern may take less.
      if result.op not in options.ops:
        sites.append(_site(program, result, False,
                           f"not among ops={sorted(options.ops)}", where))
        break
      # A forward and its backward (`follow`) are planned together: both
      # run, or neither does.
      calls = [result] + ([result.follow] if result.follow is not None else [])
      reason, points = None, []
      for call in calls:
        reason = _dry_run(program, call, options.interpret)
        point = _emission_point(program, call) if reason is None else None
        if reason is None and point is None:
          reason = "a result is used before the pattern's inputs are all computed"
        if reason is not None:
          break
        points.append(point)
      if reason is not None:
        sites.append(_site(program, result, False, reason, where))
        break
      for call, point in zip(calls, points):
        taken |= call.consumed
        written.update(call.outputs)
        ready = max((program.producer.get(o.val, -1) for o in call.operands()
                     if o.val is not None and not isinstance(o.val, Lit)), default=-1)
        emit.setdefault(point, []).append((ready, _emitter(program, call, options.interpret)))
        sites.append(_site(program, call, True, "", where))
      break
  # Calls emitted at one point run in dependency order.
  emit_before = {p: [fn for _, fn in sorted(fns, key=lambda t: t[0])]
                 for p, fns in emit.items()}
  return Plan(emit_before=emit_before, skip=taken, rewritten=rewritten)


def _subplan(closed, options: _Options, where: str, sites: list[SwapSite]):
  program = prog_lib.build(_closed_jaxpr(closed))
  plan = plan_program(program, options, where, sites)
  return None if plan.empty else (program, plan)


def _remat_runner(p, prog: Program, plan: Plan) -> Callable:
  """An evaluator of a checkpoint node (params `p`) whose body runs `plan`."""
  def run_remat(invals):
    f = jax.checkpoint(lambda *a: prog_lib.evaluate(prog, plan, list(a)),
                       prevent_cse=p.get("prevent_cse", True), policy=p.get("policy"))
    return list(f(*invals))

  run_remat.parts = (prog, plan)
  return run_remat


def _remat_parts(node, plan: Plan) -> tuple[Program, Plan]:
  """(body program, plan) of a checkpoint node of a planned program: as the
  plan rewrote it, or untouched."""
  runner = plan.rewritten.get(node.index)
  if runner is not None and hasattr(runner, "parts"):
    return runner.parts
  return (prog_lib.build(_closed_jaxpr(node.params["jaxpr"])),
          Plan(emit_before={}, skip=set(), rewritten={}))


def _closed_jaxpr(j) -> jex_core.ClosedJaxpr:
  return j if isinstance(j, jex_core.ClosedJaxpr) else jex_core.ClosedJaxpr(j, ())


def _hoist_sites(hoist: hoist_lib.Hoist, where: str) -> list[SwapSite]:
  """One report line per value computed once before a scan."""
  sites = []
  for index, region in [(None, hoist.body), *hoist.inner.items()]:
    at = where if index is None else where + "/checkpoint body"
    program = region.program
    for v in region.seeds:
      node = program.node_of(v)
      prims = []
      stack = [node.index]
      seen: set[int] = set()
      while stack:  # the work that makes this value
        i = stack.pop()
        if i in seen or i not in region.nodes:
          continue
        seen.add(i)
        prims.append(program.nodes[i].prim)
        stack.extend(program.producer.get(u, -1) for u in program.nodes[i].ins
                     if not isinstance(u, Lit))
      _, _, source = _frame(node.eqn.source_info)
      locations = tuple(dict.fromkeys(
          (f, ln) for f, ln, _ in (_frame(program.nodes[i].eqn.source_info) for i in seen)
          if f))
      sites.append(SwapSite(
          kernel=HOISTED, pattern=" + ".join(dict.fromkeys(reversed(prims))),
          call="computed once before the loop",
          output=patterns.describe_aval(program.avals[v]), source=source, where=at,
          replaced=True, locations=locations))
  return sites


def _plan_bodies(node, options: _Options, where: str,
                 sites: list[SwapSite]) -> Callable | None:
  """An evaluator for a control-flow or custom-derivative node whose body
  has replacements (None when nothing inside changes)."""
  prim, p = node.prim, node.params
  label = (where + "/" if where else "")
  if prim == "scan":
    where_body = label + "scan body"
    prog = prog_lib.build(p["jaxpr"])
    plan = plan_program(prog, options, where_body, sites)
    nconsts, ncarry = compat.scan_layout(p)
    # Each checkpoint body of the step, as planned (or untouched).
    inner = {n.index: _remat_parts(n, plan) for n in prog.nodes if n.prim == hoist_lib.REMAT}
    hoist = hoist_lib.plan_hoist(prog, nconsts, {i: q for i, (q, _) in inner.items()})
    if plan.empty and hoist.empty:
      return None
    sites.extend(_hoist_sites(hoist, where_body))

    def run_scan(invals):
      consts, init, xs = compat.split_scan_operands(p, invals)
      # The work the same at every step, once, before the loop.
      body_seeds, inner_seeds = hoist_lib.compute(hoist, consts)
      step_plan = hoist_lib.seeded(plan, hoist.body, body_seeds)
      for i, values in inner_seeds.items():
        iprog, iplan = inner[i]
        step_plan.rewritten[i] = _remat_runner(
            prog.nodes[i].params, iprog, hoist_lib.seeded(iplan, hoist.inner[i], values))

      def step(carry, x):
        outs = prog_lib.evaluate(prog, step_plan, [*consts, *carry, *x])
        return outs[:ncarry], outs[ncarry:]

      carry, ys = jax.lax.scan(step, list(init), list(xs), length=p["length"],
                               reverse=p["reverse"], unroll=p["unroll"])
      return [*carry, *ys]

    return run_scan
  if prim == "while":
    sub = _subplan(p["body_jaxpr"], options, label + "while body", sites)
    if sub is None:
      return None
    prog, plan = sub
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cond = jex_core.jaxpr_as_fun(p["cond_jaxpr"])

    def run_while(invals):
      cc, bc, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
      out = jax.lax.while_loop(lambda c: cond(*cc, *c)[0],
                               lambda c: prog_lib.evaluate(prog, plan, [*bc, *c]),
                               list(init))
      return list(out)

    return run_while
  if prim == "cond":
    subs = [_subplan(b, options, f"{label}cond branch {i}", sites)
            for i, b in enumerate(p["branches"])]
    if all(s is None for s in subs):
      return None
    fns = []
    for b, s in zip(p["branches"], subs):
      if s is None:
        fns.append(functools.partial(lambda f, *o: list(f(*o)), jex_core.jaxpr_as_fun(b)))
      else:
        fns.append(functools.partial(lambda prog, plan, *o: prog_lib.evaluate(
            prog, plan, list(o)), *s))

    def run_cond(invals):
      return list(jax.lax.switch(invals[0], fns, *invals[1:]))

    return run_cond
  if prim == hoist_lib.REMAT:  # jax.checkpoint's primitive on every supported jax
    sub = _subplan(p["jaxpr"], options, label + "checkpoint body", sites)
    if sub is None:
      return None
    return _remat_runner(p, *sub)
  if prim in ("custom_jvp_call", "custom_vjp_call") and \
      isinstance(p.get("call_jaxpr"), jex_core.ClosedJaxpr):
    closed = p["call_jaxpr"]
    # The decorated function's name (the equation has no `name` param).
    name = closed.jaxpr.debug_info.func_name
    sub = _subplan(closed, options, f"{label}{prim} {name}", sites)
    if sub is None:
      return None
    prog, plan = sub
    specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]

    def run_custom(invals):
      # The primal body changes; the user's derivative rule stays as written.
      new = jax.make_jaxpr(lambda *a: prog_lib.evaluate(prog, plan, list(a)))(*specs)
      out = prog_lib.bind(node.eqn, invals, dict(p, call_jaxpr=new))
      return list(out)

    return run_custom
  return None


# -------------------------------------------------------------- public ----


def _is_array(x) -> bool:
  return (hasattr(x, "shape") and hasattr(x, "dtype") and
          not isinstance(x, (bool, int, float, complex)))


def _is_value(x) -> bool:
  """A leaf `jax.make_jaxpr` can return (an array, a tracer, a number)."""
  return _is_array(x) or isinstance(x, (bool, int, float, complex))


def _with_statics(outs: Sequence[Any], statics: tuple[tuple[int, Any], ...]) -> list[Any]:
  full = list(outs)
  for i, x in statics:  # ascending positions: each goes back where it was
    full.insert(i, x)
  return full


@dataclasses.dataclass(frozen=True, slots=True)
class _Traced:
  program: Program
  plan: Plan
  report: SwapReport
  out_tree: Any
  dynamic: tuple[int, ...]
  #: Output leaves that are not JAX values (an equinox module's functions,
  #: as `eqx.filter_jit` returns them), by position: returned as traced.
  out_statics: tuple[tuple[int, Any], ...] = ()


class Swapped:
  """`f` with its fusible patterns replaced by `pallas_kernels` calls.

  Call it like `f`. `report(*args)` traces (abstractly) and returns the
  `SwapReport` for those arguments; `last_report` is the report of the most
  recent trace.
  """

  def __init__(self, f: Callable, ops: frozenset[str], return_report: bool,
               interpret: bool | None, target: backend.Target | None = None):
    self._f = f
    self._options = _Options(ops=ops, interpret=interpret)
    #: The device the kernels are planned and built for (None: where traced).
    self.target = target
    self._return_report = return_report
    self._cache: dict[Any, _Traced] = {}
    self.last_report: SwapReport | None = None
    functools.update_wrapper(self, f)

  def _targeting(self):
    return (backend.targeting(self.target) if self.target is not None
            else contextlib.nullcontext())

  def _trace(self, args, kwargs) -> tuple[_Traced, list[Any]]:
    with self._targeting():
      return self._trace_here(args, kwargs)

  def _trace_here(self, args, kwargs) -> tuple[_Traced, list[Any]]:
    leaves, tree = jax.tree.flatten((args, kwargs))
    dynamic = tuple(i for i, x in enumerate(leaves) if _is_array(x))
    dyn_leaves = [leaves[i] for i in dynamic]
    specs = [jax.ShapeDtypeStruct(tuple(x.shape), x.dtype) for x in dyn_leaves]
    statics = tuple((i, x) for i, x in enumerate(leaves) if i not in dynamic)
    try:
      key = (tree, statics, tuple((s.shape, str(s.dtype)) for s in specs))
      hash(key)
    except TypeError:
      key = None
    if key is not None and key in self._cache:
      return self._cache[key], dyn_leaves

    out_info: dict[str, Any] = {}

    def fun(*dyn):
      full = list(leaves)
      for i, d in zip(dynamic, dyn):
        full[i] = d
      a, k = jax.tree.unflatten(tree, full)
      out_leaves, out_info["tree"] = jax.tree.flatten(self._f(*a, **k))
      out_info["statics"] = tuple((i, x) for i, x in enumerate(out_leaves)
                                  if not _is_value(x))
      return [x for x in out_leaves if _is_value(x)]

    closed = jax.make_jaxpr(fun)(*specs)
    program = prog_lib.build(closed)
    sites: list[SwapSite] = []
    plan = plan_program(program, self._options, "", sites)
    base = getattr(self._f, "func", self._f)  # functools.partial: its function
    name = getattr(base, "__qualname__", getattr(base, "__name__", type(base).__name__))
    traced = _Traced(program=program, plan=plan,
                     report=SwapReport(function=str(name), sites=tuple(sites)),
                     out_tree=out_info["tree"], dynamic=dynamic,
                     out_statics=out_info["statics"])
    consts = list(closed.consts) + list(program.call_consts.values())
    if key is not None and not any(isinstance(c, jax.core.Tracer) for c in consts):
      self._cache[key] = traced
    return traced, dyn_leaves

  def __call__(self, *args, **kwargs):
    traced, dyn = self._trace(args, kwargs)
    self.last_report = traced.report
    with self._targeting():
      outs = prog_lib.evaluate(traced.program, traced.plan, dyn)
    result = jax.tree.unflatten(traced.out_tree, _with_statics(outs, traced.out_statics))
    return (result, traced.report) if self._return_report else result

  def report(self, *args, **kwargs) -> SwapReport:
    """The swap report for these arguments (arrays or ShapeDtypeStructs),
    without running anything."""
    traced, _ = self._trace(args, kwargs)
    self.last_report = traced.report
    return traced.report


def swap(f: Callable, *, ops: Iterable[str] | None = None, report: bool = False,
         interpret: bool | None = None, target: Any = None) -> Swapped:
  """Returns `f` with fusible patterns replaced by `pallas_kernels` calls.

  Traces `f` (at each new input signature) and replaces, through each op's
  public API and guard:

  * `dot_general` + its epilogue in the kernel's order (scale, bias,
    activation relu/gelu/gelu_tanh/silu/sigmoid/tanh however written, e.g.
    `jax.nn.gelu`, residual add, clamp, float converts) and prologue (float
    converts, int8/int4/fp8 dequantization by a scalar or per-channel scale,
    transposes) -> `matmul`;
  * layer norm and RMS norm however spelled (probed against the reference),
    with a residual add before them -> `layer_norm` / `rms_norm`;
  * softmax over the last axis (e.g. `jax.nn.softmax`) with a scale multiply
    and an additive or `where` mask before it (a causal mask becomes
    `causal=True`) -> `softmax`;
  * in a training step, a weight gradient x^T @ dy read only by optax's
    `adam`/`adamw` update of its parameter (constants and a constant learning
    rate read off by probing the update against the reference, a schedule's
    learning rate passed as the step computes it) -> `adam_matmul`, writing
    the parameter and both moments; a gradient also read elsewhere (a
    global-norm clip) is left to XLA;
  * a large vocabulary's head `x @ w (+ b)` and its integer-label
    cross-entropy -> `linear_cross_entropy`, and in a training step its
    backward (`dlogits @ w^T`, `x^T @ dlogits`, the bias sum) -> a second
    call, the op's own VJP at the losses' cotangent.

  Work a `lax.scan` body repeats at every step from the scan's constants
  alone (also inside a `jax.checkpoint` in the body, where XLA cannot hoist
  it) is computed once before the loop ("hoisted out of the loop" in the
  report), whatever `ops` says.

  Patterns inside `jit` calls, `lax.scan`/`while_loop`/`cond` bodies,
  `jax.checkpoint` and custom_jvp/custom_vjp primal bodies are swapped too.
  A pattern the op's guard rejects (dtype, shape, backend) is left as XLA's,
  untouched, and reported with the guard's reason.

  Args:
    f: the function (plain, or `jax.jit`-wrapped: it is traced as a call).
    ops: restrict to these ops ("matmul", "layer_norm", "rms_norm",
      "softmax", "adam_matmul", ...); None: all.
    report: if True, the swapped function returns `(outputs, SwapReport)`;
      the report is a pytree without leaves, so this works under `jax.jit`
      (and as `has_aux` for `jax.grad`).
    interpret: Pallas interpret mode for the kernels; None interprets exactly
      where no GPU/TPU compiles them.
    target: the device to plan and build the kernels for, as
      `backend.resolve_target` takes it: a name ("h200", "a100", "cpu"), a
      `jax.Device` (a compile-only topology's too) or a `Target`; each guard is
      asked for that device and each kernel built for it (e.g. the Mosaic GPU
      matmul for a Hopper GPU). None: each kernel builds, as the op called
      directly does, for the device its operands are placed on; on a
      CPU-only machine for this CPU and the GPUs, the lowering keeping one,
      so the same swapped function runs here and compiles for an H200.

  Returns:
    A `Swapped` callable; `.report(*args)` gives the report without running.

  Raises:
    ValueError: for an unknown op in `ops`.
  """
  known = _ops()
  chosen = frozenset(known if ops is None else ops)
  unknown = chosen - set(known)
  if unknown:
    raise ValueError(f"unknown ops {sorted(unknown)}; expected some of {sorted(known)}")
  return Swapped(f, chosen, report, interpret, backend.resolve_target(target))
