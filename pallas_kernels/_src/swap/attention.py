"""Attention chains routed to JAX's fused attention.

A gemm -> (scale, mask, causal) softmax -> gemm chain, however its einsums
order the axes, is one call of `jax.nn.dot_product_attention` with
`implementation="cudnn"` where cuDNN's flash attention takes it (bf16/f16 on
Ampere or later, head dimension within cuDNN's limit), JAX's Pallas
attention kernel (`mha`, Triton) where cuDNN cannot and the chain has no
mask other than a causal one, and XLA's gemm, softmax and gemm otherwise --
recorded as a fallback, so `swap` leaves that chain to XLA and says why
(`jax_attention.py` holds the rules).

`match_attention` anchors at the scores gemm: the softmax between the gemms
is the one `patterns.match_rows` recognises, the probabilities' gemm must
read it as its left operand, summing the keys.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src import jax_attention
from pallas_kernels._src.swap import patterns
from pallas_kernels._src.swap.patterns import Match, Operand, Rejection, Result
from pallas_kernels._src.swap.program import Node, Program

#: The op name swap reports and `ops=` takes.
OP = "attention"


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
  """Where each role's axes are in the chain's operands (hashable: a static
  argument). q and k: (batch axes, sequence axis, head axis); v: (batch axes,
  key axis, head axis). The result has the probabilities' gemm's order:
  [batch..., queries, head_dim]."""

  q: tuple[tuple[int, ...], int, int]
  k: tuple[tuple[int, ...], int, int]
  v: tuple[tuple[int, ...], int, int]
  #: Whether the probabilities' gemm writes [batch..., head_dim, queries]
  #: (v its left operand, as XLA may order an einsum's operands).
  head_first: bool = False


def _bthd(x, axes: tuple[tuple[int, ...], int, int]):
  """x as [B, T, N, H]: its batch axes as (batch, heads) -- the last batch
  axis the heads, one head where there is a single batch axis."""
  batch, seq, head = axes
  x = jnp.transpose(x, (*batch, seq, head))
  lead = x.shape[:-2]
  n = lead[-1] if len(lead) >= 2 else 1
  x = x.reshape(math.prod(lead) // n, n, x.shape[-2], x.shape[-1])
  return jnp.swapaxes(x, 1, 2)


class _Gpu:
  """What the rules read of a device: its compute capability."""

  def __init__(self, target: backend_lib.Target):
    cc = target.compute_capability
    self.name = target.device_kind
    self.compute_capability = f"{cc // 10}.{cc % 10}" if cc else ""


def attention(q, k, v, mask=None, *, layout: Layout, scale: float, causal: bool,
              out_dtype: str, implementation: str | None = None,
              interpret: bool | None = None):
  """The chain's result, [batch..., queries, head_dim] in `out_dtype`, by the
  fused call the target takes (`implementation`/`interpret` as swap passes
  them to every op: "xla" runs JAX's XLA implementation)."""
  qs, ks, vs = (_bthd(a, ax) for a, ax in ((q, layout.q), (k, layout.k), (v, layout.v)))
  lead = tuple(q.shape[a] for a in layout.q[0])
  b, t, n, h = qs.shape
  scores = (b, n, t, ks.shape[1])
  bias = mask_arg = None
  if mask is not None:
    m = jnp.broadcast_to(mask, lead + scores[2:]).reshape(scores)
    bias, mask_arg = (None, m) if m.dtype == jnp.bool_ else (m, None)

  def run(call: str, interp: bool = False):
    if call == "pallas":
      from jax.experimental.pallas.ops.gpu import attention as jax_mha  # noqa: PLC0415
      out = jax_mha.mha(qs, ks, vs, None, sm_scale=scale, causal=causal,
                        interpret=interp)
    else:
      out = jax.nn.dot_product_attention(qs, ks, vs, bias=bias, mask=mask_arg, scale=scale,
                                         is_causal=causal, implementation=call)
    out = jnp.swapaxes(out, 1, 2).reshape(lead + (t, h))
    if layout.head_first:
      out = jnp.swapaxes(out, -1, -2)
    return out.astype(out_dtype)

  if implementation == "xla":
    return run("xla")

  def launch(interp: bool):
    shape = jax_attention.AttentionShape(
        dtype=patterns._short(qs.dtype),  # XLA's name, as the rules speak of it
        batch=(b, n), queries=t, keys=scores[-1], head_dim=h)
    target = backend_lib.target()
    gpu = _Gpu(target) if target.backend is backend_lib.Backend.GPU else None
    why = jax_attention.cudnn_reason(shape, gpu) or (
        "" if interp else jax_attention.cudnn_available())
    if not why and not interp:
      return run("cudnn")
    pallas = jax_attention.pallas_reason(shape, gpu)
    if not pallas and mask is None:
      return run("pallas", interp)
    if interp and not why:
      why = "cuDNN's fused attention runs compiled only (interpret mode)"
    reason = f"{why}; {pallas or 'a mask other than causal'}"
    guard_lib.record_fallback(OP, reason, guard_lib.signature(q=q, k=k, v=v))
    return run("xla")

  return backend_lib.dispatch(interpret, (q, k, v, mask), launch)


# ------------------------------------------------------------- matching ----


def _axes(node: Node, side: int, rank: int) -> tuple[tuple[int, ...], int, int] | None:
  """(batch axes, the free axis, the contracted axis) of operand `side` of a
  dot_general, when it has one free and one contracted axis."""
  (lc, rc), (lb, rb) = node.params["dimension_numbers"]
  contracting, batch = (lc, lb) if side == 0 else (rc, rb)
  free = [a for a in range(rank) if a not in contracting and a not in batch]
  if len(contracting) != 1 or len(free) != 1:
    return None
  return tuple(batch), free[0], contracting[0]


def _softmax_after(program: Program, scores: int, taken: set[int]) -> Match | None:
  """The softmax `match_rows` finds on `scores` (through its scale, mask and
  float converts), reading exactly that value."""
  v = scores
  for _ in range(6):
    for u in program.uses.get(v, ()):
      node = program.nodes[u]
      if node.prim == "reduce_max" and u not in taken:
        found = patterns.match_rows(program, node, taken)
        if isinstance(found, Match) and found.op == "softmax":
          x = found.positional[0][1].val
          if x == scores or (program.node_of(x) is not None and
                             program.node_of(x).ins[0] == scores and
                             program.node_of(x).prim == "convert_element_type"):
            return found
    user = program.single_use(v)
    if user is None or user.prim not in ("convert_element_type", "mul", "div", "add",
                                          "select_n", "sub"):
      return None
    v = user.outs[0]
  return None


def match_attention(program: Program, dot: Node, taken: set[int]) -> Result:
  """q @ k^T -> softmax -> p @ v as one fused attention call (anchored at the
  scores gemm); None where the dot starts no such chain."""
  if dot.index in taken:
    return None
  q, k = dot.ins
  out = dot.outs[0]
  ranks = [len(program.aval(x).shape) for x in (q, k)]
  qa, ka = _axes(dot, 0, ranks[0]), _axes(dot, 1, ranks[1])
  if qa is None or ka is None or len(qa[0]) != len(ka[0]):
    return None
  softmax = _softmax_after(program, out, taken)
  if softmax is None:
    return None
  probs = softmax.outputs[0]
  pv = program.single_use(probs)
  if pv is None or pv.prim != "dot_general" or probs not in pv.ins or pv.index in taken:
    return None
  nb = len(qa[0])
  side = pv.ins.index(probs)  # p @ v, or v^T p^T as an einsum may order it
  (lc, rc), (lb, rb) = pv.params["dimension_numbers"]
  contracting, batch = (lc, lb) if side == 0 else (rc, rb)
  if tuple(contracting) != (nb + 1,) or tuple(batch) != tuple(range(nb)):
    return None  # p @ v sums the keys of p's [batch..., q, k]
  v = pv.ins[1 - side]
  va = _axes(pv, 1 - side, len(program.aval(v).shape))
  if va is None:
    return None
  statics = dict(softmax.static)
  scale = statics.get("scale")
  causal = bool(statics.get("causal"))
  items = [i for i in softmax.items if i != "statistics"]
  consumed = frozenset(softmax.consumed | {dot.index, pv.index})
  if causal and statics.get("causal_alignment") != "top_left":
    return Rejection(OP, tuple(items), "a bottom-right causal mask: "
                     "jax.nn.dot_product_attention's is_causal is top-left",
                     dot.index, consumed)
  keywords = tuple((name, o) for name, o in softmax.keywords if name == "mask")
  dtype = jnp.dtype(program.aval(pv.outs[0]).dtype).name
  return Match(
      op=OP, items=tuple(items),
      positional=(("q", Operand(q)), ("k", Operand(k)), ("v", Operand(v))),
      keywords=keywords,
      static=(("layout", Layout(qa, ka, (va[0], va[2], va[1]), head_first=side == 1)),
              ("scale", 1.0 if scale is None else float(scale)),
              ("causal", causal), ("out_dtype", dtype)),
      outputs=(pv.outs[0],), consumed=consumed, anchor=dot.index)
