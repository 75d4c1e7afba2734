"""What a forward's backward is made of in a step traced after `jax.grad`.

A kernel that replaces a forward chain in a training step must also take
the equations of its backward, which read the forward's intermediates. The
matchers (`cross_entropy.py`, `group_norm.py`) find those equations by
replaying candidates against the op's own VJP; this module holds what they
share: an eager replay of a set of equations, which nodes still matter, and
which nodes go with the calls (readers nothing needs, producers only the
calls' equations read).
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap.program import Lit, Program, Val


def replay_nodes(program: Program, nodes: set[int], inputs: dict[Val, tuple]) -> dict:
  """The values `nodes` compute from `inputs` ({value: (array, dtype)}),
  run eagerly on this CPU whatever trace the swap runs under (as probe.py)."""
  with prog_lib.eager_here():
    env = {v: jnp.asarray(a, dtype) for v, (a, dtype) in inputs.items()}

    def read(v):
      if isinstance(v, Lit):
        return v.value
      return env[v] if v in env else program.value_of(v)

    for i in sorted(nodes):
      node = program.nodes[i]
      got = prog_lib.bind(node.eqn, [read(v) for v in node.ins])
      for o, val in zip(node.outs, got if node.eqn.primitive.multiple_results else [got]):
        env[o] = val
  return env


def dead(program: Program, index: int) -> bool:
  """Whether nothing reads what node `index` computes (tracing leaves such
  nodes: optax's log-normalizer takes `sign` of the sum it never uses)."""
  return not any(program.uses.get(o) or o in program.returned
                 for o in program.nodes[index].outs)


def live(program: Program) -> set[int]:
  """Nodes whose results reach what the program returns."""
  live: set[int] = set()
  stack = [v for v in program.returned]
  while stack:
    node = program.node_of(stack.pop())
    if node is None or node.index in live:
      continue
    live.add(node.index)
    stack.extend(v for v in node.ins if not isinstance(v, Lit))
  return live


def dead_readers(program: Program, nodes: set[int], live: set[int]) -> set[int]:
  """The nodes outside `nodes` that nothing returned needs and that read,
  directly or through each other, what `nodes` compute (tracing leaves
  them: a max's derivative where `stop_gradient` cut it off)."""
  found: set[int] = set()
  stack = [o for i in nodes for o in program.nodes[i].outs]
  while stack:
    for u in program.uses.get(stack.pop(), ()):
      if u not in nodes and u not in found and u not in live:
        found.add(u)
        stack.extend(program.nodes[u].outs)
  return found


def orphans(program: Program, nodes: set[int], taken: set[int], needed: set[Val]
             ) -> set[int]:
  """The nodes computing only what `nodes` read (the zeros a gather's
  transpose scatters into), none of the `needed` values the calls read:
  skipped with them, not left computing a [tokens, vocab] array nobody
  reads."""
  found: set[int] = set()
  stack = [v for i in nodes for v in program.nodes[i].ins if not isinstance(v, Lit)]
  while stack:
    node = program.node_of(stack.pop())
    if node is None or node.index in nodes or node.index in found or node.index in taken:
      continue
    if all(o not in program.returned and o not in needed and
           all(u in nodes or u in found for u in program.uses.get(o, ()))
           for o in node.outs):
      found.add(node.index)
      stack.extend(v for v in node.ins if not isinstance(v, Lit))
  return found
