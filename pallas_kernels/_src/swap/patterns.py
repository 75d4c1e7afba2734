"""The pattern registry: which equations each kernel can take over.

Patterns are keyed by their anchor primitive (`REGISTRY`): a `dot_general`
anchors the matmul pattern (prologue: converts, dequantizing multiplies,
transposes; epilogue in the kernel's order: scale, bias, activation, residual,
clamp, with float converts anywhere); a reduction over the last axis anchors
the row patterns (layer norm, RMS norm, softmax), recognised by probing (see
`probe.py`), with the norms' residual-add prologue and softmax's scale and
mask prologue. A matcher returns a `Match` (the kernel call that replaces the
equations it absorbs), a `Rejection` (a pattern the kernel cannot take, and
why), or None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src.ops.matmul import reference as mm_reference
from pallas_kernels._src.swap import probe
from pallas_kernels._src.swap.program import Lit, Node, Program, Val


@dataclasses.dataclass(frozen=True, slots=True)
class Operand:
  """An argument of a kernel call, read from the program when it runs."""

  #: The program value (None for `constant`).
  val: Val | None = None
  #: "" (as is), "reshape" (to `shape`), "neg", "recip", "full" (broadcast
  #: the scalar `val` to `shape`), "not" (logical not).
  transform: str = ""
  shape: tuple[int, ...] = ()
  #: A concrete array known while tracing (e.g. a constant mask).
  constant: Any = None

  def resolve(self, read: Callable[[Val], Any]) -> Any:
    """The argument's value (traced under the caller's trace)."""
    if self.val is None:
      return jnp.asarray(self.constant)
    if isinstance(self.val, Lit) and self.transform in ("", "recip", "neg"):
      v = float(np.asarray(self.val.value))
      return {"": v, "recip": 1.0 / v, "neg": -v}[self.transform]
    x = read(self.val)
    if self.transform == "reshape":
      return jnp.reshape(x, self.shape)
    if self.transform == "neg":
      return -x
    if self.transform == "recip":
      return 1.0 / x
    if self.transform == "full":
      return jnp.broadcast_to(jnp.reshape(x, ()), self.shape)
    if self.transform == "not":
      return jnp.logical_not(x)
    return x

  def abstract(self, program: Program) -> Any:
    """A stand-in for dry runs: a ShapeDtypeStruct or a Python float."""
    if self.val is None:
      return jax.ShapeDtypeStruct(np.shape(self.constant), np.asarray(self.constant).dtype)
    aval = program.aval(self.val)
    if isinstance(self.val, Lit) and self.transform in ("", "recip", "neg"):
      return 1.0
    shape = self.shape if self.transform in ("reshape", "full") else tuple(aval.shape)
    return jax.ShapeDtypeStruct(shape, aval.dtype)

  def describe(self, program: Program) -> str:
    """e.g. "f32[128]" or "0.125"."""
    if self.val is None:
      c = np.asarray(self.constant)
      return f"constant {_short(c.dtype)}[{','.join(map(str, c.shape))}]"
    if isinstance(self.val, Lit) and self.transform in ("", "recip", "neg"):
      v = float(np.asarray(self.val.value))
      return f"{ {'': v, 'recip': 1.0 / v, 'neg': -v}[self.transform]:.6g}"
    a = self.abstract(program)
    return f"{_short(a.dtype)}[{','.join(map(str, a.shape))}]"


def _short(dtype) -> str:
  name = jnp.dtype(dtype).name
  return {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
          "int8": "s8", "int32": "s32", "int64": "s64", "bool": "pred"}.get(name, name)


def describe_aval(aval) -> str:
  return f"{_short(aval.dtype)}[{','.join(map(str, aval.shape))}]"


@dataclasses.dataclass(frozen=True, slots=True)
class Match:
  """A kernel call that replaces equations of the program."""

  #: "matmul", "layer_norm", "rms_norm" or "softmax".
  op: str
  #: What the kernel fuses, e.g. ("bias", "activation:gelu", "residual").
  items: tuple[str, ...]
  #: Positional arguments (name, operand), in the op's order.
  positional: tuple[tuple[str, Operand], ...]
  #: Keyword array arguments (name, operand).
  keywords: tuple[tuple[str, Operand], ...]
  #: Static keyword arguments.
  static: tuple[tuple[str, Any], ...]
  #: Value ids the call's results define (the op's return order).
  outputs: tuple[int, ...]
  #: Nodes whose work the call does.
  consumed: frozenset[int]
  #: The anchor node (its source line names the pattern).
  anchor: int
  #: A second call planned with this one, or neither runs: a forward's
  #: backward (the fused cross-entropy's gradient), emitted where the
  #: cotangent it reads is computed.
  follow: Match | None = None

  def operands(self) -> tuple[Operand, ...]:
    return tuple(o for _, o in self.positional + self.keywords)


@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
  """A pattern left to XLA, and why."""

  op: str
  items: tuple[str, ...]
  reason: str
  anchor: int
  consumed: frozenset[int] = frozenset()
  signature: str = ""


Result = Match | Rejection | None
Matcher = Callable[[Program, Node, set[int]], Result]


# ------------------------------------------------------------- helpers ----


def _shape(program: Program, v: Val) -> tuple[int, ...]:
  return tuple(program.aval(v).shape)


def _dtype(program: Program, v: Val):
  return jnp.dtype(program.aval(v).dtype)


def _is_float(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.floating)


def _is_numeric(dtype) -> bool:
  """Float or integer: patterns over integers are matched (and reported) so
  that the op's guard can say why it does not take them."""
  return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)


def _float_convert(node: Node | None, program: Program) -> bool:
  return (node is not None and node.prim == "convert_element_type" and
          _is_float(_dtype(program, node.ins[0])) and
          _is_float(node.params["new_dtype"]))


def _other(node: Node, v: Val) -> Val | None:
  """The operand of a binary `node` that is not `v` (None if both are)."""
  a, b = node.ins
  if a == v and b != v:
    return b
  if b == v and a != v:
    return a
  return None


def vector_form(program: Program, v: Val, n: int, rank: int) -> Operand | None:
  """`v` as a kernel scalar or [N] vector operand, looking through
  broadcasts and float converts; None when it varies along other axes."""
  shape = _shape(program, v)
  if isinstance(v, Lit):
    return Operand(v) if int(np.prod(shape)) == 1 and _is_numeric(_dtype(program, v)) else None
  if not _is_numeric(_dtype(program, v)):
    return None
  if shape == ():
    return Operand(v)
  if all(d == 1 for d in shape):
    return Operand(v, "reshape", ())
  if shape == (n,):
    return Operand(v)
  if len(shape) <= rank and shape[-1] == n and all(d == 1 for d in shape[:-1]):
    return Operand(v, "reshape", (n,))
  node = program.node_of(v)
  if node is None:
    return None
  if node.prim == "broadcast_in_dim":
    src = node.ins[0]
    dims = tuple(node.params["broadcast_dimensions"])
    src_shape = _shape(program, src)
    keep = [d for d, s in zip(dims, src_shape) if s != 1]
    if not keep:
      return vector_form(program, src, n, rank) if src_shape == () else \
          Operand(src, "reshape", ()) if _is_numeric(_dtype(program, src)) else None
    if keep == [len(shape) - 1] and shape[-1] == n:
      return (Operand(src) if src_shape == (n,) else Operand(src, "reshape", (n,))) \
          if _is_numeric(_dtype(program, src)) else None
    return None
  if _float_convert(node, program):
    return vector_form(program, node.ins[0], n, rank)
  return None


def numpy_broadcastable(program: Program, v: Val, out_shape: tuple[int, ...]
                        ) -> Operand:
  """`v` (broadcast to `out_shape` by a broadcast_in_dim, maybe) as an operand
  that broadcasts NumPy-style to `out_shape` without being expanded."""
  node = program.node_of(v)
  if node is not None and node.prim == "broadcast_in_dim":
    src = node.ins[0]
    dims = tuple(node.params["broadcast_dimensions"])
    src_shape = _shape(program, src)
    target = [1] * len(out_shape)
    for d, s in zip(dims, src_shape):
      target[d] = s
    while len(target) > 1 and target[0] == 1:
      target.pop(0)
    return Operand(src, "reshape", tuple(target))
  return Operand(v)


# -------------------------------------------------------------- matmul ----


def _dot_layout(xs, ws, lc, rc, lb, rb) -> tuple[bool, bool] | str:
  """(transpose_x, transpose_w) for a dot_general the kernel can run, or why
  it cannot."""
  if len(lc) != 1 or len(rc) != 1:
    return f"contracts {len(lc)} dimensions (the kernel contracts one)"
  nb = len(lb)
  if tuple(lb) != tuple(range(nb)) or tuple(rb) != tuple(range(nb)):
    return (f"batch dimensions {tuple(lb)}/{tuple(rb)} are not the leading dimensions "
            "(the kernel reads [..., M, K] and [..., K, N]; a transpose copy would "
            "cost what fusing saves)")
  if len(ws) != nb + 2:
    return f"w has {len(ws) - nb} free dimensions (the kernel takes one, N)"
  if nb and len(xs) != nb + 2:
    return f"x has {len(xs) - nb} free dimensions with batch dimensions"
  if len(xs) < 2:
    return "x is a vector (the kernel needs [..., M, K])"
  if lc[0] not in (len(xs) - 1, len(xs) - 2):
    return f"x contracts dimension {lc[0]}, not one of its last two"
  return lc[0] == len(xs) - 2, rc[0] == nb + 1


def precision_reason(precision) -> str | None:
  """Why the kernel cannot keep a dot's `precision` (a dot algorithm rather
  than `jax.lax.Precision` levels), or None."""
  if precision is not None and not isinstance(precision, tuple):
    return f"dot algorithm {precision} (the kernel takes jax.lax.Precision levels only)"
  return None


_QUANTIZED = frozenset({"int8", "int4", "float8_e4m3fn", "float8_e5m2"})


def _prologue(program: Program, v: Val, dot: Node, taken: set[int], role: str,
              n: int) -> tuple[Val, Operand | None, list[int], list[str], bool]:
  """Looks through what only feeds the dot on side `role` ("x" or "w"):
  returns (operand, dequantization scale, absorbed nodes, items, transposed)."""
  consumed: list[int] = []
  items: list[str] = []
  transposed = False
  scale = None
  for _ in range(4):
    node = program.node_of(v)
    if node is None or node.index in taken or program.single_use(v) is None:
      break
    if node.prim == "transpose":
      perm = tuple(node.params["permutation"])
      r = len(perm)
      if r >= 2 and perm == tuple(range(r - 2)) + (r - 1, r - 2) and not transposed:
        transposed = True
        consumed.append(node.index)
        items.append("transpose")
        v = node.ins[0]
        continue
      break
    if node.prim == "convert_element_type":
      src = node.ins[0]
      name = _dtype(program, src).name
      if name in _QUANTIZED or _is_float(_dtype(program, src)):
        consumed.append(node.index)
        items.append("dequantize" if name in _QUANTIZED else "cast")
        v = src
        continue
      break
    if node.prim == "mul" and scale is None:
      found = None
      for q, sc in (tuple(node.ins), tuple(node.ins[::-1])):
        qn = program.node_of(q)
        if (qn is None or qn.prim != "convert_element_type" or qn.index in taken or
            program.single_use(q) is None or
            _dtype(program, qn.ins[0]).name not in _QUANTIZED):
          continue
        if int(np.prod(_shape(program, sc))) == 1 and _is_float(_dtype(program, sc)):
          form = Operand(sc) if _shape(program, sc) == () else Operand(sc, "reshape", ())
        elif role == "w" and not transposed:
          # Per output channel: constant along K, i.e. [N] along w's last axis.
          form = vector_form(program, sc, n, len(_shape(program, q)))
        else:
          form = None
        if form is not None:
          found = (form, qn)
          break
      if found is None:
        break
      scale, qn = found
      consumed += [node.index, qn.index]
      items.append("dequantize")
      v = qn.ins[0]
      continue
    break
  return v, scale, consumed, items, transposed


def match_matmul(program: Program, dot: Node, taken: set[int]) -> Result:
  """dot_general, its prologue and its epilogue, as one `matmul` call."""
  (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
  X, W = dot.ins
  xs, ws = _shape(program, X), _shape(program, W)
  layout = _dot_layout(xs, ws, tuple(lc), tuple(rc), tuple(lb), tuple(rb))
  out_shape = tuple(program.avals[dot.outs[0]].shape)
  n, rank = out_shape[-1], len(out_shape)
  consumed = {dot.index}
  items: list[str] = []

  # Epilogue, in the kernel's order: scale, bias, activation, residual, clamp.
  stage = 0
  scale = bias = residual = None
  activation = None
  clamp = None
  cur = dot.outs[0]
  while True:
    step = _epilogue_step(program, cur, stage, out_shape, n, rank, taken | consumed)
    if step is None:
      if stage >= 5:
        break
      found = _pointwise(program, cur, taken | consumed)
      if found is None:
        break
      op, nodes, out = found
      if not _region_closed(program, cur, nodes, out):
        break  # An inner value read elsewhere (a jvp's `x > 0`): the kernel writes none.
      if op.activation and stage < 3:
        activation, stage = op.activation, 3
        items.append(f"activation:{op.activation}")
        if op.clamp:
          clamp, stage = op.clamp, 5
          items.append("clamp")
      elif op.activation == "relu" and not op.clamp:
        clamp, stage = (0.0, None), 5  # relu after the residual is a clamp
        items.append("clamp")
      elif op.clamp and not op.activation:
        clamp, stage = op.clamp, 5
        items.append("clamp")
      else:
        break
      consumed.update(nodes)
      cur = out
      continue
    kind, operand, node = step
    consumed.add(node.index)
    cur = node.outs[0]
    if kind == "cast":
      if "cast" not in items:
        items.append("cast")
      continue
    items.append(kind)
    if kind == "scale":
      scale, stage = operand, 1
    elif kind == "bias":
      bias, stage = operand, 2
    else:
      residual, stage = operand, 4

  x, x_scale, x_nodes, x_items, tx = _prologue(program, X, dot, taken, "x", n)
  w, w_scale, w_nodes, w_items, tw = _prologue(program, W, dot, taken, "w", n)
  # The kernel's dot runs in compute_dtype(x, w): never below the program's.
  want = jnp.promote_types(_dtype(program, X), _dtype(program, W))
  if mm_reference.compute_dtype(_dtype(program, x), _dtype(program, w)) != want:
    x, x_scale, x_nodes, x_items, tx = X, None, [], [], False
    w, w_scale, w_nodes, w_items, tw = W, None, [], [], False
  pro_items = [f"{side} {i}" for side, its in (("x", x_items), ("w", w_items)) for i in its]
  all_items = tuple(pro_items + items)
  if not any(i.split(" ")[-1] != "transpose" for i in all_items):
    return None  # Nothing XLA leaves behind: its own dot is as good.
  precision = dot.params.get("precision")
  layout = precision_reason(precision) or layout
  if isinstance(layout, str):
    return Rejection("matmul", all_items, layout, dot.index, frozenset(consumed))
  transpose_x, transpose_w = layout
  transpose_x ^= tx
  transpose_w ^= tw
  consumed.update(x_nodes + w_nodes)
  keywords = [(k, o) for k, o in (("bias", bias), ("residual", residual),
                                  ("scale", scale), ("x_scale", x_scale),
                                  ("w_scale", w_scale)) if o is not None]
  static = [("out_dtype", _dtype(program, cur).name)]
  if activation:
    static.append(("activation", activation))
  if clamp:
    static.append(("clamp", clamp))
  if transpose_x:
    static.append(("transpose_x", True))
  if transpose_w:
    static.append(("transpose_w", True))
  if precision is not None:
    static.append(("precision", precision))  # The user's dot precision, kept.
  return Match(op="matmul", items=all_items,
               positional=(("x", Operand(x)), ("w", Operand(w))),
               keywords=tuple(keywords), static=tuple(static), outputs=(cur,),
               consumed=frozenset(consumed), anchor=dot.index)


def _epilogue_step(program: Program, cur: int, stage: int, out_shape, n: int,
                   rank: int, taken: set[int]):
  """The next binary epilogue step after `cur` (its only user): ("cast" |
  "scale" | "bias" | "residual", operand, node), or None."""
  user = program.single_use(cur)
  if user is None or user.index in taken:
    return None
  if _float_convert(user, program):
    return "cast", None, user
  if tuple(program.avals[user.outs[0]].shape) != out_shape:
    return None
  other = _other(user, cur) if len(user.ins) == 2 else None
  if other is None:
    return None
  first = user.ins[0] == cur
  if user.prim in ("mul", "div") and stage < 1 and (first or user.prim == "mul"):
    form = vector_form(program, other, n, rank)
    if form is not None:
      if user.prim == "div":
        if form.transform != "":
          return None  # 1 / a reshaped vector: rare; left to XLA.
        form = dataclasses.replace(form, transform="recip")
      return "scale", form, user
  if user.prim in ("add", "sub") and stage < 2 and (first or user.prim == "add"):
    form = vector_form(program, other, n, rank)
    if form is not None:
      scalar = (_shape(program, form.val) == () if form.transform == ""
                else form.transform == "reshape" and form.shape == ())
      if scalar:
        form = Operand(form.val, "full", (n,))
      if user.prim == "sub":
        if form.transform != "":
          return None
        form = dataclasses.replace(form, transform="neg")
      return "bias", form, user
  if user.prim == "add" and stage < 4 and not isinstance(other, Lit) and \
      _shape(program, other) == out_shape and _is_numeric(_dtype(program, other)):
    src = program.node_of(other)
    if src is not None and src.prim == "broadcast_in_dim":
      return None  # An expanded broadcast (e.g. a mask): a kernel should not read it.
    return "residual", Operand(other), user
  return None


def _pointwise(program: Program, start: int, taken: set[int]):
  """The activation/clamp region after `start`: (PointOp, nodes, output)."""
  try:
    region = probe.grow(program, start, taken=taken, elementwise_only=True, limit=64)
  except probe.NotRowwise:
    return None
  if not region.nodes:
    return None
  candidates = sorted((v for v, k in region.kinds.items()
                       if k is probe.Kind.FULL and v != start and v in program.producer),
                      key=program.producer.__getitem__, reverse=True)
  pprobe = None
  for out in candidates:
    nodes = probe.cone(program, region, out)
    if not nodes or not _is_numeric(_dtype(program, out)):
      continue
    if pprobe is None:
      pprobe = probe.PointProbe(program, region)
    op = pprobe.classify(nodes, out)
    if op is not None:
      return op, nodes, out
  return None


# ---------------------------------------------------------------- rows ----


#: Unary steps between a row region's start and its reductions.
_UNARY = frozenset({"convert_element_type", "integer_pow", "square", "abs"})


def _starts(program: Program, v: Val) -> list[int]:
  """Candidate region starts behind a reduction's operand, farthest first."""
  chain = []
  for _ in range(4):
    if isinstance(v, Lit):
      break
    chain.append(v)
    node = program.node_of(v)
    if node is None:
      break
    if node.prim in _UNARY or (node.prim == "mul" and node.ins[0] == node.ins[1]):
      v = node.ins[0]
      continue
    break
  return [c for c in reversed(chain) if _is_float(_dtype(program, c))]


def match_rows(program: Program, red: Node, taken: set[int]) -> Result:
  """A layer norm, RMS norm or softmax around a last-axis reduction."""
  if red.index in taken:
    return None
  shape = _shape(program, red.ins[0])
  # (REGISTRY calls this for reduce_sum and reduce_max: both have axes.)
  if not shape or tuple(red.params["axes"]) != (len(shape) - 1,):
    return None
  for h in _starts(program, red.ins[0]):
    try:
      region = probe.grow(program, h, taken=taken, elementwise_only=False)
    except probe.NotRowwise:
      continue
    if red.index not in region.nodes:
      continue
    rprobe = probe.RowProbe(program, region)
    candidates = sorted((v for v, k in region.kinds.items()
                         if k is probe.Kind.FULL and v != h and v in program.producer),
                        key=program.producer.__getitem__, reverse=True)
    for out in candidates:
      if not _is_float(_dtype(program, out)):
        continue
      nodes = probe.cone(program, region, out)
      if nodes is None or red.index not in nodes:
        continue
      op = rprobe.classify(nodes, out)
      if op is None:
        continue
      if op.op == "softmax":
        return _softmax_match(program, h, out, set(nodes), red, taken)
      return _norm_match(program, h, out, set(nodes), op, red, taken)
  return None


def _absorb_convert_after(program: Program, out: int, consumed: set[int],
                          taken: set[int]) -> int:
  user = program.single_use(out)
  if _float_convert(user, program) and user.index not in taken:
    consumed.add(user.index)
    return user.outs[0]
  return out


def _only_used_by(program: Program, v: Val, nodes: set[int]) -> bool:
  if isinstance(v, Lit) or v in program.returned:
    return False
  return all(u in nodes for u in program.uses.get(v, ()))


def _region_closed(program: Program, start: int, nodes, out: int) -> bool:
  """Whether the region's start and every value it makes but `out` are read
  by the region alone: the kernel that replaces it writes only `out` (in a
  differentiated step the backward reads the pre-activation too)."""
  inside = set(nodes)
  inner = [o for i in inside for o in program.nodes[i].outs if o != out]
  return all(_only_used_by(program, v, inside) for v in (start, *inner))


def _norm_match(program: Program, h: int, out: int, consumed: set[int],
                op: probe.RowOp, red: Node, taken: set[int]) -> Result:
  items = []
  out = _absorb_convert_after(program, out, consumed, taken)
  n = _shape(program, h)[-1]
  dt = _dtype(program, h)
  x: Val = h
  keywords = []
  outputs = [out]
  node = program.node_of(h)
  if node is not None and node.prim == "add" and node.index not in taken:
    a, b = node.ins
    if all(not isinstance(v, Lit) and _shape(program, v) == _shape(program, h) and
           _is_float(_dtype(program, v)) for v in (a, b)) and a != b:
      x = a
      keywords.append(("residual", Operand(b)))
      consumed.add(node.index)
      outputs.append(h)
      items.append("residual")
  gamma = (Operand(op.gamma, "reshape", (n,)) if op.gamma is not None
           else Operand(constant=np.ones((n,), dt)))
  positional = [("x", Operand(x)), ("gamma", gamma)]
  if op.op == "layer_norm":
    positional.append(("beta", Operand(op.beta, "reshape", (n,)) if op.beta is not None
                       else Operand(constant=np.zeros((n,), dt))))
  items = ["statistics"] + items + ["cast"] * (_dtype(program, out) != dt)
  return Match(op=op.op, items=tuple(items), positional=tuple(positional),
               keywords=tuple(keywords),
               static=(("eps", op.eps), ("out_dtype", _dtype(program, out).name)),
               outputs=tuple(outputs), consumed=frozenset(consumed), anchor=red.index)


#: A `where` fill at or below this removes an entry as well as -inf does.
_MASK_FILL = -1e9


def _is_fill(program: Program, v: Val, dtype) -> bool:
  value = program.value_of(v)
  if value is None:
    return False
  arr = np.asarray(value, np.float64)
  if arr.size == 0 or not np.all(arr == arr.flat[0]):
    return False
  f = float(arr.flat[0])
  return f == -np.inf or f <= _MASK_FILL or f <= float(jnp.finfo(dtype).min)


def _softmax_match(program: Program, h: int, out: int, consumed: set[int],
                   red: Node, taken: set[int]) -> Result:
  out = _absorb_convert_after(program, out, consumed, taken)
  items = ["statistics"]
  shape = _shape(program, h)
  x: Val = h
  mask = None
  scale = None
  causal = None
  for _ in range(6):  # Walk back: converts, then the mask, then the scale.
    node = program.node_of(x)
    if node is None or node.index in taken or not _only_used_by(program, x, consumed):
      break
    if _float_convert(node, program):
      consumed.add(node.index)
      x = node.ins[0]
      continue
    if node.prim == "select_n" and mask is None and scale is None and len(node.ins) == 3:
      pred, fill, s = node.ins
      if _is_fill(program, fill, _dtype(program, s)) and _shape(program, s) == shape:
        mask = numpy_broadcastable(program, pred, shape)
        consumed.add(node.index)
        items.append("mask")
        x = s
        continue
      break
    if node.prim == "add" and mask is None and scale is None:
      a, b = node.ins
      if not isinstance(a, Lit) and _shape(program, a) == shape and \
          _is_float(_dtype(program, b)):
        mask = numpy_broadcastable(program, b, shape)
        consumed.add(node.index)
        items.append("mask")
        x = a
        continue
      break
    if node.prim in ("mul", "div") and scale is None:
      for s, c in ((node.ins[0], node.ins[1]),) + (
          ((node.ins[1], node.ins[0]),) if node.prim == "mul" else ()):
        value = program.value_of(c)
        if value is not None and np.size(value) == 1 and _shape(program, s) == shape:
          v = float(np.asarray(value).reshape(()))
          if node.prim == "div" and v == 0.0:
            continue
          scale = 1.0 / v if node.prim == "div" else v
          consumed.add(node.index)
          items.append("scale")
          x = s
          break
      else:
        break
      continue
    break
  if mask is not None and mask.val is not None:
    causal = _causal(program, mask, shape)
  keywords = []
  static = [("out_dtype", _dtype(program, out).name)]
  if scale is not None:
    static.append(("scale", scale))
  if causal is not None:
    static += [("causal", True), ("causal_alignment", causal)]
    items[items.index("mask")] = "causal mask"
  elif mask is not None:
    keywords.append(("mask", mask))
  return Match(op="softmax", items=tuple(items), positional=(("x", Operand(x)),),
               keywords=tuple(keywords), static=tuple(static), outputs=(out,),
               consumed=frozenset(consumed), anchor=red.index)


def _causal(program: Program, mask: Operand, shape: tuple[int, ...]) -> str | None:
  """"top_left"/"bottom_right" when a known boolean mask is the causal one."""
  value = program.value_of(mask.val)
  if value is None or np.asarray(value).dtype != np.bool_ or len(shape) < 2:
    return None
  m = np.asarray(value).reshape(mask.shape if mask.transform == "reshape" else np.shape(value))
  q, k = shape[-2], shape[-1]
  if m.ndim < 2 or m.shape[-2:] != (q, k) or any(d != 1 for d in m.shape[:-2]):
    return None
  m = m.reshape(q, k)
  for alignment, offset in (("top_left", 0), ("bottom_right", k - q)):
    if np.array_equal(m, np.arange(k)[None, :] <= np.arange(q)[:, None] + offset):
      return alignment
  return None


#: Anchor primitive -> matchers, tried in order.
REGISTRY: Mapping[str, tuple[Matcher, ...]] = {
    "dot_general": (match_matmul,),
    "reduce_sum": (match_rows,),
    "reduce_max": (match_rows,),
}
