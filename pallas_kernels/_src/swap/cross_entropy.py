"""A large vocabulary's projection and cross-entropy as one
`linear_cross_entropy` call, which never writes the [tokens, vocab] logits.

Libraries spell the loss in many ways (optax's integer-label cross-entropy
subtracts the picked logit from the log-normalizer; others take the label's
entry of `jax.nn.log_softmax`; masks, casts and `stop_gradient`s come
between). As `probe.py` does for norms, `match_cross_entropy` does not match
spellings: from the logits gemm (its bias and float casts taken) it finds the
per-token values computed from the logits and one integer array alone, and
replays each candidate's equations on random logits and labels against
`logsumexp(logits) - logits[label]`. The one that equals it is the loss; the
call replaces the gemm and everything between it and the loss, provided
nothing else reads the logits.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import tolerances
from pallas_kernels._src.swap import glu
from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap.patterns import Match, Operand, Rejection, Result
from pallas_kernels._src.swap.program import Lit, Node, Program, Val

OP = "linear_cross_entropy"
#: The same rule as the audit's: the fusion pays where the vocabulary is at
#: least this many times the model dimension.
VOCAB_RATIO = 4
#: The replay runs the user's equations at their own shapes: logits of more
#: elements than this are not replayed (the chain is left to XLA, saying so).
MAX_REPLAY = 1 << 26


def linear_cross_entropy(x, w, labels, *, shape: tuple[int, ...] | None = None, **kwargs):
  """`pallas_kernels.linear_cross_entropy`, its per-token losses shaped as the
  program held them (`take_along_axis` keeps a trailing axis of 1)."""
  from pallas_kernels._src.ops.linear_cross_entropy import api  # noqa: PLC0415
  out = api.linear_cross_entropy(x, w, labels, **kwargs)
  return out if shape is None else out.reshape(shape)


def _logits(program: Program, dot: Node, taken: set[int], consumed: set[int]):
  """(logits value, bias operand) after the gemm's bias add and float casts."""
  out_shape = tuple(program.aval(dot.outs[0]).shape)
  n, rank = out_shape[-1], len(out_shape)
  cur, bias, stage = dot.outs[0], None, 1
  while True:
    step = patterns._epilogue_step(program, cur, stage, out_shape, n, rank,
                                   taken | consumed)
    if step is None or step[0] not in ("cast", "bias"):
      return cur, bias
    kind, operand, node = step
    consumed.add(node.index)
    cur = node.outs[0]
    if kind == "bias":
      bias, stage = operand, 2


def _region(program: Program, logits: Val, tokens: int, vocab: int) -> set[int]:
  """Nodes computed from the logits whose results stay per token (and per
  class): where the loss can be."""
  sizes = {tokens * vocab, tokens}
  found: set[int] = set()
  stack = [logits]
  while stack:
    for u in program.uses.get(stack.pop(), ()):
      node = program.nodes[u]
      if u in found or not all(
          math.prod(program.aval(o).shape) in sizes for o in node.outs):
        continue
      found.add(u)
      stack.extend(node.outs)
  return found


def _cone(program: Program, out: Val, logits: Val, region: set[int]):
  """(nodes computing `out` from the logits, the values it reads from
  outside), or None when it reads more than the logits, one integer array
  and constants."""
  nodes: set[int] = set()
  outside: set[Val] = set()
  stack = [out]
  while stack:
    v = stack.pop()
    if v == logits or isinstance(v, Lit) or program.value_of(v) is not None:
      continue
    node = program.node_of(v)
    if node is None or node.index not in region:
      outside.add(v)
      continue
    if node.index not in nodes:
      nodes.add(node.index)
      stack.extend(node.ins)
  labels = [v for v in outside if jnp.issubdtype(program.aval(v).dtype, jnp.integer)]
  if len(outside) != 1 or len(labels) != 1:
    return None
  return nodes, labels[0]


def _replay(program: Program, nodes: set[int], logits: Val, labels: Val, out: Val,
            vocab: int, seed: int = 0) -> bool:
  """Whether the nodes compute logsumexp(logits) - logits[label] per token."""
  rng = np.random.default_rng(seed)
  shape = tuple(program.aval(logits).shape)
  lab_shape = tuple(program.aval(labels).shape)
  x = rng.standard_normal(shape).astype(np.float32) * 4
  lab = rng.integers(0, vocab, size=math.prod(lab_shape))
  lab[:2] = (0, vocab - 1)  # both ends of the vocabulary
  with jax.ensure_compile_time_eval(), jax.default_device(jax.devices("cpu")[0]):
    env = {logits: jnp.asarray(x, program.aval(logits).dtype),
           labels: jnp.asarray(lab.reshape(lab_shape), program.aval(labels).dtype)}

  def read(v):
    if isinstance(v, Lit):
      return v.value
    return env[v] if v in env else program.value_of(v)

  # Eagerly on this CPU, whatever trace the swap runs under (as probe.py).
  with jax.ensure_compile_time_eval(), jax.default_device(jax.devices("cpu")[0]):
    for i in sorted(nodes):
      node = program.nodes[i]
      got = prog_lib.bind(node.eqn, [read(v) for v in node.ins])
      for o, val in zip(node.outs, got if node.eqn.primitive.multiple_results else [got]):
        env[o] = val
  logits32 = np.asarray(env[logits], np.float32).reshape(-1, vocab)
  picked = logits32[np.arange(logits32.shape[0]), lab]
  top = logits32.max(axis=-1)
  want = np.log(np.exp(logits32 - top[:, None]).sum(axis=-1)) + top - picked
  got = np.asarray(env[out], np.float32).reshape(-1)
  # The relative error norm `validate` uses, at the logits' dtype's bound
  # (the replay ran in that dtype).
  bound = tolerances.tolerance(program.aval(logits).dtype)
  return got.shape == want.shape and tolerances.relative_error(got, want) <= bound


def _dead(program: Program, index: int) -> bool:
  """Whether nothing reads what node `index` computes (tracing leaves such
  nodes: optax's log-normalizer takes `sign` of the sum it never uses)."""
  return not any(program.uses.get(o) or o in program.returned
                 for o in program.nodes[index].outs)


def match_cross_entropy(program: Program, dot: Node, taken: set[int]) -> Result:
  """x @ w (+ bias) -> cross-entropy with integer labels, per token, as one
  `linear_cross_entropy(..., reduction="none")` call; None where the gemm
  feeds no such loss."""
  if dot.index in taken or not glu._plain(program, dot):
    return None
  d, vocab = patterns._shape(program, dot.ins[1])
  if vocab < VOCAB_RATIO * d:
    return None
  consumed: set[int] = {dot.index}
  logits, bias = _logits(program, dot, taken, consumed)
  shape = tuple(program.aval(logits).shape)
  tokens = math.prod(shape[:-1])
  region = _region(program, logits, tokens, vocab) - taken
  candidates = [o for i in sorted(region, reverse=True) for o in program.nodes[i].outs
                if math.prod(program.aval(o).shape) == tokens and
                jnp.issubdtype(program.aval(o).dtype, jnp.floating)]
  for out in candidates:
    cone = _cone(program, out, logits, region)
    if cone is None:
      continue
    nodes, labels = cone
    if math.prod(shape) > MAX_REPLAY:
      return Rejection(OP, ("log_softmax", "label"), (
          f"logits {patterns.describe_aval(program.aval(logits))} are larger than the "
          f"{MAX_REPLAY} elements the swap replays to recognise a cross-entropy"),
          dot.index, frozenset(consumed | nodes))
    if not _replay(program, nodes, logits, labels, out, vocab):
      continue
    consumed |= nodes
    inner = {o for i in consumed for o in program.nodes[i].outs} - {out}
    outside = {u for v in inner for u in program.uses.get(v, ()) if u not in consumed}
    consumed |= {u for u in outside if _dead(program, u)}  # skipped with the chain
    readers = sorted(u for u in outside if not _dead(program, u))
    if readers or inner & program.returned:
      return Rejection(OP, ("log_softmax", "label"), (
          "the logits (or a value between them and the loss) are read elsewhere, "
          "so they would still be written"), dot.index, frozenset(consumed))
    if jnp.dtype(program.aval(out).dtype) != jnp.float32:
      return Rejection(OP, ("log_softmax", "label"), (
          f"the loss is {jnp.dtype(program.aval(out).dtype).name}; the kernel "
          "returns float32"), dot.index, frozenset(consumed))
    keywords = (("bias", bias),) if bias is not None else ()
    items = ("bias",) * (bias is not None) + ("log_softmax", "label")
    labels_op = Operand(labels, "reshape", shape[:-1])
    return Match(op=OP, items=items,
                 positional=(("x", Operand(dot.ins[0])), ("w", Operand(dot.ins[1])),
                             ("labels", labels_op)),
                 keywords=keywords,
                 static=(("reduction", "none"),
                         ("shape", tuple(program.aval(out).shape))),
                 outputs=(out,), consumed=frozenset(consumed), anchor=dot.index)
  return None
