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

In a training step traced after `jax.grad`, the backward reads the logits
too: `dlogits = (softmax(logits) - onehot(label)) * g`, then `dx = dlogits @
w^T`, `dw = x^T @ dlogits` and the bias gradient's sum over the tokens.
`_backward` finds those gemms and that sum, takes the equations between the
forward's values and them, and finds the per-token cotangent `g` among the
values they read (a constant `1/N` for a mean): replayed with random logits,
labels and `g`, they must compute the formula above. The forward call then
comes with a second one, at the backward's place: the kernel's own VJP at
`g` (`cotangent=`), which recomputes the logits tile by tile, so neither
pass writes them. Nothing else may read what the two calls absorb.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import tolerances
from pallas_kernels._src.swap import backward as backward_lib
from pallas_kernels._src.swap import glu
from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap.patterns import Match, Operand, Rejection, Result
from pallas_kernels._src.swap.program import Lit, Node, Program, Val

OP = "linear_cross_entropy"
#: The same rule as the audit's: the fusion pays where the vocabulary is at
#: least this many times the model dimension.
VOCAB_RATIO = 4
#: The replay runs the user's equations at their own shapes: logits of more
#: elements than this are not replayed (the chain is left to XLA, saying so).
MAX_REPLAY = 1 << 26


def linear_cross_entropy(x, w, labels, *, shape: tuple[int, ...] | None = None,
                         cotangent=None, grads: tuple[str, ...] = (),
                         dtypes: tuple[str, ...] = (), w_layout: str = "dv", **kwargs):
  """`pallas_kernels.linear_cross_entropy`, its per-token losses shaped as the
  program held them (`take_along_axis` keeps a trailing axis of 1).

  With `cotangent` (the per-token losses' cotangent, labels' shape), the
  gradients instead, through the op's own VJP: `grads` names which ("x",
  "w", "bias") and in what order, `dtypes` their types in the program, and
  `w_layout` "vd" gives dw transposed, as `dy^T @ x` computes it."""
  from pallas_kernels._src.ops.linear_cross_entropy import api  # noqa: PLC0415
  if cotangent is None:
    out = api.linear_cross_entropy(x, w, labels, **kwargs)
    return out if shape is None else out.reshape(shape)
  bias = kwargs.pop("bias", None)
  kwargs["reduction"] = "none"
  _, pull = jax.vjp(lambda x, w, b: api.linear_cross_entropy(x, w, labels, bias=b, **kwargs),
                    x, w, bias)
  dx, dw, db = pull(jnp.reshape(cotangent, labels.shape).astype(jnp.float32))
  got = {"x": dx, "w": dw.T if w_layout == "vd" else dw, "bias": db}
  return tuple(got[k].astype(t) for k, t in zip(grads, dtypes, strict=True))


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
  env = backward_lib.replay_nodes(program, nodes, {
      logits: (x, program.aval(logits).dtype),
      labels: (lab.reshape(lab_shape), program.aval(labels).dtype)})
  logits32 = np.asarray(env[logits], np.float32).reshape(-1, vocab)
  picked = logits32[np.arange(logits32.shape[0]), lab]
  top = logits32.max(axis=-1)
  want = np.log(np.exp(logits32 - top[:, None]).sum(axis=-1)) + top - picked
  got = np.asarray(env[out], np.float32).reshape(-1)
  # The relative error norm `validate` uses, at the logits' dtype's bound
  # (the replay ran in that dtype).
  bound = tolerances.tolerance(program.aval(logits).dtype)
  return got.shape == want.shape and tolerances.relative_error(got, want) <= bound


def _grow(program: Program, start: set[int], stop: set[int], live: set[int],
          tokens: int, vocab: int):
  """(region, frontier): the live nodes computed from the values of `start`
  that stay per token or per token and class; the gemms and the sums down
  to one per class that read them. A reason string where something else
  reads them."""
  region: set[int] = set()
  frontier: set[int] = set()
  stack = [o for i in start for o in program.nodes[i].outs if o not in stop]
  while stack:
    for u in program.uses.get(stack.pop(), ()):
      if u in start or u in region or u in frontier or u not in live:
        continue
      node = program.nodes[u]
      sizes = [program.size(o) for o in node.outs]
      if node.prim == "dot_general" or (node.prim == "reduce_sum" and sizes == [vocab]):
        frontier.add(u)
        continue
      if not all(n in (tokens, tokens * vocab) for n in sizes):
        return f"{node.prim} reads them"
      region.add(u)
      stack.extend(node.outs)
  return region, frontier


def _walk(program: Program, out: Val, stops: set[Val], tokens: int):
  """(nodes computing `out`, per-token float values among them) back to
  `stops`, literals and constants; None where it reaches another input.
  Per-token float constants are walked through (a mean's cotangent `1/N`
  is one, and its negation another)."""
  nodes: set[int] = set()
  per_token: list[Val] = []
  stack = [out]
  seen: set[Val] = set()
  while stack:
    v = stack.pop()
    if isinstance(v, Lit) or v in stops or v in seen:
      continue
    seen.add(v)
    aval = program.aval(v)
    per = program.size(v) == tokens and jnp.issubdtype(aval.dtype, jnp.floating)
    if program.value_of(v) is not None and not per:
      continue
    node = program.node_of(v)
    if node is None:
      if program.value_of(v) is not None:
        continue
      return None
    if per:
      per_token.append(v)
    if node.index not in nodes:
      nodes.add(node.index)
      stack.extend(node.ins)
  return nodes, per_token


def _from(program: Program, v: Val, nodes: set[int]) -> set[Val]:
  """The values among `nodes`' results computed from `v`."""
  found = {v}
  for i in sorted(nodes):
    node = program.nodes[i]
    if any(u in found for u in node.ins if not isinstance(u, Lit)):
      found.update(node.outs)
  return found


def _replay_grad(program: Program, nodes: set[int], logits: Val, labels: Val, g: Val,
                 d: Val, vocab: int, seed: int = 1) -> bool:
  """Whether the nodes compute (softmax(logits) - onehot(label)) * g."""
  rng = np.random.default_rng(seed)
  shape = tuple(program.aval(logits).shape)
  lab_shape = tuple(program.aval(labels).shape)
  x = rng.standard_normal(shape).astype(np.float32) * 4
  lab = rng.integers(0, vocab, size=math.prod(lab_shape))
  lab[:2] = (0, vocab - 1)
  cot = rng.standard_normal(tuple(program.aval(g).shape)).astype(np.float32)
  env = backward_lib.replay_nodes(program, nodes, {
      logits: (x, program.aval(logits).dtype),
      labels: (lab.reshape(lab_shape), program.aval(labels).dtype),
      g: (cot, program.aval(g).dtype)})
  logits32 = np.asarray(env[logits], np.float32).reshape(-1, vocab)
  p = np.exp(logits32 - logits32.max(axis=-1, keepdims=True))
  p /= p.sum(axis=-1, keepdims=True)
  p[np.arange(p.shape[0]), lab] -= 1.0
  want = p * np.asarray(env[g], np.float32).reshape(-1, 1)
  got = np.asarray(env[d], np.float32).reshape(-1)
  bound = tolerances.tolerance(program.aval(d).dtype)
  return got.shape == want.reshape(-1).shape and \
      tolerances.relative_error(got, want.reshape(-1)) <= bound


def _backward(program: Program, dot: Node, logits: Val, labels: Val, loss: Val,
              forward: frozenset[int], bias: Operand | None, taken: set[int]
              ) -> Match | str:
  """The backward of the forward chain `forward` as a second call (the op's
  VJP at the losses' cotangent), or why the logits' other readers are not
  that backward."""
  live = backward_lib.live(program)
  shape = tuple(program.aval(logits).shape)
  tokens, rank = math.prod(shape[:-1]), len(shape)
  vocab = shape[-1]
  lead = tuple(range(rank - 1))
  x, w = dot.ins
  grown = _grow(program, set(forward), {loss}, live, tokens, vocab)
  if isinstance(grown, str):
    return grown
  region, frontier = grown
  if not frontier:
    return "no gemm or bias sum reads the logits' gradient"
  made = {o for i in forward | region for o in program.nodes[i].outs}
  reads = {v for i in frontier for v in program.nodes[i].ins
           if not isinstance(v, Lit) and v in made}
  if len(reads) != 1:
    return "the gemms read more than one array computed from the logits"
  (d,) = reads
  if tuple(program.aval(d).shape) != shape:
    return "the logits' gradient is not laid out as the logits"
  outputs: dict[str, tuple[Val, int]] = {}  # grad -> (program value, node)
  w_layout, absorbed = "dv", set()
  for i in sorted(frontier):
    node = program.nodes[i]
    if node.prim == "reduce_sum":
      if bias is None or tuple(node.params["axes"]) != lead or "bias" in outputs:
        return "a sum of the logits' gradient is not the bias gradient"
      outputs["bias"] = (node.outs[0], i)
      continue
    (lc, rc), (lb, rb) = node.params["dimension_numbers"]
    side = node.ins.index(d)
    other = node.ins[1 - side]
    mine, theirs = (lc, rc) if side == 0 else (rc, lc)
    if lb or rb:
      return "a gemm reads the logits' gradient with batch dimensions"
    if other == w and side == 0 and tuple(mine) == (rank - 1,) and tuple(theirs) == (1,) \
        and "x" not in outputs:
      outputs["x"] = (node.outs[0], i)
    elif other == x and tuple(mine) == lead and tuple(theirs) == lead and "w" not in outputs:
      out = node.outs[0]
      if side == 0:  # dy^T @ x: dw transposed, often transposed back
        user = program.single_use(out)
        if user is not None and user.prim == "transpose" and user.index not in taken and \
            tuple(user.params["permutation"]) == (1, 0):
          out = user.outs[0]
          absorbed.add(user.index)
        else:
          w_layout = "vd"
      outputs["w"] = (out, i)
    else:
      return "a gemm reads the logits' gradient with neither x nor w"
  # The per-token cotangent: the value the backward's equations read that
  # the logits do not compute, tried earliest first.
  # (The losses stop the walk: a cotangent computed from them, a log of the
  # mean's, is still the cotangent.)
  walked = _walk(program, d, {logits, labels, loss}, tokens)
  if walked is None:
    return "the logits' gradient reads arrays other than the logits, labels and cotangent"
  nodes, per_token = walked
  from_logits = _from(program, logits, nodes)
  g = None
  for cand in sorted((v for v in per_token if v not in from_logits),
                     key=lambda v: program.producer.get(v, -1)):
    cone = _walk(program, d, {logits, labels, cand}, tokens)
    if cone is not None and _replay_grad(program, cone[0], logits, labels, cand, d, vocab):
      g, nodes = cand, cone[0]
      break
  if g is None:
    return "no per-token cotangent makes the backward (softmax - onehot) * g"
  consumed = (nodes | region | frontier | absorbed) - forward
  consumed |= backward_lib.dead_readers(program, consumed | forward, live)
  needed = {v for v in (x, w, labels, g, None if bias is None else bias.val)
            if v is not None and not isinstance(v, Lit)}
  consumed |= backward_lib.orphans(program, consumed | forward, taken, needed)
  if consumed & taken:
    return "an earlier kernel call took part of the backward"
  keep = {v for v, _ in outputs.values()} | {loss}
  for i in consumed | forward:
    for o in program.nodes[i].outs:
      if o in keep:
        continue
      if o in program.returned or any(u not in consumed | forward
                                      for u in program.uses.get(o, ())):
        return "a value between the logits and their gradient is read elsewhere"
  order = [k for k in ("x", "w", "bias") if k in outputs]
  keywords = [("cotangent", Operand(g, "reshape", shape[:-1]))]
  if bias is not None:
    keywords.insert(0, ("bias", bias))
  return Match(
      op=OP, items=("backward",),
      positional=(("x", Operand(x)), ("w", Operand(w)),
                  ("labels", Operand(labels, "reshape", shape[:-1]))),
      keywords=tuple(keywords),
      static=(("grads", tuple(order)),
              ("dtypes", tuple(jnp.dtype(program.aval(outputs[k][0]).dtype).name
                               for k in order)),
              ("w_layout", w_layout)),
      outputs=tuple(outputs[k][0] for k in order), consumed=frozenset(consumed),
      anchor=min(outputs[k][1] for k in order))


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
    consumed |= {u for u in outside if backward_lib.dead(program, u)}  # skipped with the chain
    readers = sorted(u for u in outside if not backward_lib.dead(program, u))
    backward = None
    if readers or inner & program.returned:
      backward = _backward(program, dot, logits, labels, out, frozenset(consumed),
                           bias, taken)
      if isinstance(backward, str):
        return Rejection(OP, ("log_softmax", "label"), (
            "the logits (or a value between them and the loss) are read elsewhere, "
            f"so they would still be written ({backward})"), dot.index,
            frozenset(consumed))
    if jnp.dtype(program.aval(out).dtype) != jnp.float32:
      return Rejection(OP, ("log_softmax", "label"), (
          f"the loss is {jnp.dtype(program.aval(out).dtype).name}; the kernel "
          "returns float32"), dot.index, frozenset(consumed))
    keywords = (("bias", bias),) if bias is not None else ()
    items = ("bias",) * (bias is not None) + ("log_softmax", "label")
    labels_op = Operand(labels, "reshape", shape[:-1])
    forward = Match(op=OP, items=items,
                    positional=(("x", Operand(dot.ins[0])), ("w", Operand(dot.ins[1])),
                                ("labels", labels_op)),
                    keywords=keywords,
                    static=(("reduction", "none"),
                            ("shape", tuple(program.aval(out).shape))),
                    outputs=(out,), consumed=frozenset(consumed), anchor=dot.index,
                    follow=backward)
    return _cast_on_load(program, dot, forward, taken)
  return None


def _narrowed(program: Program, v: Val, taken: set[int]) -> Node | None:
  """The convert that narrows a wider float array into gemm operand `v` (f32
  parameters cast to bf16 for a mixed-precision head), or None."""
  node = program.node_of(v)
  if not patterns._float_convert(node, program) or node.index in taken:
    return None
  wide, narrow = patterns._dtype(program, node.ins[0]), patterns._dtype(program, v)
  return node if jnp.dtype(wide).itemsize > jnp.dtype(narrow).itemsize else None


def _cast_on_load(program: Program, dot: Node, forward: Match, taken: set[int]) -> Match:
  """`forward` (and its backward) reading x and w from before the converts
  that narrow them, rounded by the kernel as it loads them
  (`compute_dtype`), so that nothing writes the narrow copy; the gradients
  the program widens back (the converts' transposes) come out wide. As
  planned where a convert feeds anything but the two calls."""
  backward = forward.follow
  calls = forward.consumed | (backward.consumed if backward else frozenset())
  converts = {}
  for name, v in zip(("x", "w"), dot.ins):
    node = _narrowed(program, v, taken)
    if node is not None and v not in program.returned and \
        all(u in calls for u in program.uses.get(v, ())):
      converts[name] = node
  if not converts:
    return forward
  compute = jnp.promote_types(*(patterns._dtype(program, v) for v in dot.ins)).name

  def source(positional):
    return tuple((k, Operand(converts[k].ins[0]) if k in converts else o)
                 for k, o in positional)

  absorbed = frozenset(n.index for n in converts.values())
  if backward is not None:
    grads, dtypes = dict(backward.static)["grads"], list(dict(backward.static)["dtypes"])
    outputs, widened = list(backward.outputs), set()
    for i, k in enumerate(grads):
      user = program.single_use(outputs[i])
      if k in converts and user is not None and user.index not in taken and \
          patterns._float_convert(user, program) and \
          jnp.dtype(user.params["new_dtype"]) == patterns._dtype(program, converts[k].ins[0]):
        outputs[i] = user.outs[0]
        dtypes[i] = jnp.dtype(user.params["new_dtype"]).name
        widened.add(user.index)
    static = tuple((k, tuple(dtypes) if k == "dtypes" else v) for k, v in backward.static)
    backward = dataclasses.replace(
        backward, positional=source(backward.positional),
        static=static + (("compute_dtype", compute),), outputs=tuple(outputs),
        consumed=backward.consumed | widened)
  return dataclasses.replace(
      forward, positional=source(forward.positional),
      static=forward.static + (("compute_dtype", compute),),
      consumed=forward.consumed | absorbed, follow=backward)
