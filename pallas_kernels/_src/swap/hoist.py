"""Loop-invariant work hoisted out of `lax.scan` bodies.

A scan body that computes from its constants alone (the weights) does the
same work at every step. XLA hoists such work out of a while loop
(WhileLoopInvariantCodeMotion), but not out of a `jax.checkpoint` region: the
optimization barrier that keeps remat's recomputation apart also keeps it in
the loop. flax's `OptimizedLSTMCell` under `nn.remat` concatenates its four
gate kernels inside the checkpoint, so the backward scan writes and reads the
concatenated kernels at every step (the audit's `loop-invariant` finding).

`plan_hoist` finds the equations of a scan body, and of the checkpoint
bodies it calls, whose operands are the scan's constants or values hoisted
before them. It keeps the ones whose results are no larger than their
operands (a broadcast or an iota, which XLA fuses into its reader, stays in
the loop) and that something still in the loop reads. The swap evaluates
them once, before the scan, and seeds their results into each step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jax.extend import core as jex_core

from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap.program import Lit, Plan, Program, Val

#: The checkpoint primitive, whose body's invariant work is hoisted too.
REMAT = "remat2"
#: Views and casts XLA folds into their reader (a gemm's operand layout, a
#: fusion's load): hoisted only after other hoisted work, never alone.
_VIEWS = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims",
                    "convert_element_type", "transpose", "copy", "copy_p"})


@dataclasses.dataclass(frozen=True, slots=True)
class Region:
  """The hoisted work of one program: which nodes, and the values of theirs
  that the work left in the loop reads."""

  program: Program
  nodes: tuple[int, ...]
  seeds: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Hoist:
  """What to compute before a scan: in its body, and in the checkpoint
  bodies it calls (by the body's node index, each with the body values that
  feed the checkpoint's invariant operands)."""

  body: Region
  inner: Mapping[int, Region]

  @property
  def empty(self) -> bool:
    return not self.body.seeds and not any(r.seeds for r in self.inner.values())



def _hoistable(program: Program, node) -> bool:
  # Never a node with bodies of its own (a scan, a checkpoint, a kernel).
  if node.eqn.effects or any(True for _ in jex_core.jaxprs_in_params(node.params)):
    return False
  ins = [v for v in node.ins if not isinstance(v, Lit)]
  if not ins:
    return False  # made from literals alone (an iota, a fill): XLA fuses it
  # Not larger than what it reads: a broadcast is cheaper in the loop.
  return sum(program.size(o) for o in node.outs) <= sum(program.size(v) for v in ins)


def _region(program: Program, invariant: set[Val]) -> Region:
  """The hoistable nodes of `program` given its `invariant` values, and the
  values of theirs read by the nodes left (or returned)."""
  known = set(invariant)
  nodes: list[int] = []
  chosen: set[int] = set()
  for node in program.nodes:
    if all(isinstance(v, Lit) or v in known or program.value_of(v) is not None
           for v in node.ins) and _hoistable(program, node) and (
               node.prim not in _VIEWS or
               any(program.producer.get(v) in chosen for v in node.ins
                   if not isinstance(v, Lit))):
      nodes.append(node.index)
      chosen.add(node.index)
      known.update(node.outs)
  # (Work no seed needs is dead: hoisted with the rest, XLA drops it.)
  seeds = [o for i in nodes for o in program.nodes[i].outs
           if o in program.returned or
           any(u not in chosen for u in program.uses.get(o, ()))]
  return Region(program=program, nodes=tuple(nodes), seeds=tuple(seeds))


def plan_hoist(program: Program, n_consts: int,
               inner_programs: Mapping[int, Program]) -> Hoist:
  """The work of a scan body `program` (its first `n_consts` inputs the
  scan's constants) and of its checkpoint bodies (`inner_programs`, by node
  index) that is the same at every step."""
  invariant: set[Val] = set(program.invars[:n_consts]) | set(program.constvars)
  body = _region(program, invariant)
  hoisted = invariant | {o for i in body.nodes for o in program.nodes[i].outs}
  inner = {}
  for index, sub in inner_programs.items():
    node = program.nodes[index]
    if index in body.nodes:
      continue
    inv = {iv for iv, v in zip(sub.invars, node.ins)
           if isinstance(v, Lit) or v in hoisted or program.value_of(v) is not None}
    region = _region(sub, inv | set(sub.constvars))
    if region.seeds:
      inner[index] = region
  # The body's values a checkpoint's hoisted work reads are seeds as well.
  extra = [v for index, r in inner.items()
           for iv, v in zip(r.program.invars, program.nodes[index].ins)
           if not isinstance(v, Lit) and program.producer.get(v) in body.nodes]
  body = dataclasses.replace(body, seeds=tuple(dict.fromkeys(body.seeds + tuple(extra))))
  return Hoist(body=body, inner=inner)


def _run(region: Region, env: dict[Val, Any]) -> None:
  program = region.program

  def read(v):
    if isinstance(v, Lit):
      return v.value
    return env[v] if v in env else program.value_of(v)

  for i in region.nodes:
    node = program.nodes[i]
    out = prog_lib.bind(node.eqn, [read(v) for v in node.ins])
    for o, val in zip(node.outs, out if node.eqn.primitive.multiple_results else [out]):
      env[o] = val


def compute(hoist: Hoist, consts: Sequence[Any]
            ) -> tuple[dict[Val, Any], dict[int, dict[Val, Any]]]:
  """The seeds' values, computed once from the scan's constants (under the
  caller's trace, before the scan): the body's, and each checkpoint body's."""
  program = hoist.body.program
  env: dict[Val, Any] = dict(program.call_consts)
  env.update(zip(program.constvars, program.consts))
  env.update(zip(program.invars, consts))
  _run(hoist.body, env)
  body = {v: env[v] for v in hoist.body.seeds}
  inner = {}
  for index, region in hoist.inner.items():
    sub = region.program
    ienv: dict[Val, Any] = dict(sub.call_consts)
    ienv.update(zip(sub.constvars, sub.consts))
    for iv, v in zip(sub.invars, program.nodes[index].ins):
      if isinstance(v, Lit):
        ienv[iv] = v.value
      elif v in env:
        ienv[iv] = env[v]
      elif program.value_of(v) is not None:
        ienv[iv] = program.value_of(v)
    _run(region, ienv)
    inner[index] = {v: ienv[v] for v in region.seeds}
  return body, inner


def seeded(plan: Plan, region: Region, values: Mapping[Val, Any]) -> Plan:
  """`plan` with the region's work skipped and its seeds set before the
  first node."""
  def seed(_read: Callable[[Val], Any]) -> dict[Val, Any]:
    return dict(values)
  emit = dict(plan.emit_before)
  emit[0] = [seed, *emit.get(0, [])]
  return Plan(emit_before=emit, skip=set(plan.skip) | set(region.nodes),
              rewritten=dict(plan.rewritten))
