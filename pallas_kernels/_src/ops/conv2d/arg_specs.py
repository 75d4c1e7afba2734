"""conv2d's `SPEC`: cases for `validate`, `bench` and the tests, its cost
model, sweep parameters, and the audit findings it closes with the call it
suggests (`spec.py`).

Positional arguments of a case are x, w and then the optional arrays it
has, in the order (scale, shift, bias, residual), all differentiable; the
keyword `operands` names those after w (a case has no None among its
arrays). Sizes are odd and prime where a block edge would hide a bug;
weights are scaled by 1/sqrt(KH * KW * C/G) so the outputs stay O(1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.conv2d import reference
from pallas_kernels._src.ops.conv2d.api import conv2d
from pallas_kernels._src.ops.conv2d.config import Config
from pallas_kernels._src.spec import Call, CallFacts, Case, Closes, OpSpec, SweepParam

#: The optional arrays, in their positional order after x and w.
OPTIONAL_ARRAYS = ("scale", "shift", "bias", "residual")
#: Keywords that steer the implementation, not the math.
_IMPL_KEYWORDS = ("implementation", "interpret", "config")
#: Small blocks: several pixel, channel and F tiles on CI shapes.
SMALL = Config(block_p=16, block_f=8, block_c=4)


@dataclasses.dataclass(frozen=True, slots=True)
class CaseDef:
  """A case before its arrays exist."""

  n: int
  h: int
  w: int
  c: int
  f: int
  kh: int = 3
  kw: int = 3
  stride: int | tuple[int, int] = 1
  padding: Any = "SAME"
  dilation: int | tuple[int, int] = 1
  groups: int = 1
  dtype: str = "float32"
  #: The prologue's arrays: "affine" (scale and shift), "scale", "shift" or None.
  prologue: str | None = None
  prologue_activation: str | None = None
  bias: bool = False
  activation: str | None = None
  residual: bool = False
  out_dtype: str | None = None
  statistics: bool = False
  config: Config | None = None
  tags: frozenset[str] = frozenset({"ci"})
  grad: bool = False

  @property
  def arrays(self) -> tuple[str, ...]:
    """Names of the optional arrays the case passes."""
    have = {"scale": self.prologue in ("affine", "scale"),
            "shift": self.prologue in ("affine", "shift"),
            "bias": self.bias, "residual": self.residual}
    return tuple(name for name in OPTIONAL_ARRAYS if have[name])

  @property
  def name(self) -> str:
    parts = [inputs.describe("x", (self.n, self.h, self.w, self.c), self.dtype),
             inputs.describe("w", (self.kh, self.kw, self.c // self.groups, self.f),
                             self.dtype)]
    for label, v, default in (("stride", self.stride, 1), ("dilation", self.dilation, 1),
                              ("groups", self.groups, 1)):
      if v != default:
        parts.append(f"{label}:{v}")
    parts.append(f"pad:{self.padding}".replace(" ", ""))
    if self.prologue or self.prologue_activation:
      parts.append(f"pro:{self.prologue or ''}+{self.prologue_activation or 'identity'}")
    if self.bias:
      parts.append("bias")
    if self.activation:
      parts.append(self.activation)
    if self.residual:
      parts.append("residual")
    if self.statistics:
      parts.append("stats")
    if self.out_dtype:
      parts.append(f"out:{inputs.short_dtype(self.out_dtype)}")
    if self.config is not None:
      c = self.config
      parts.append(f"blocks:{c.block_p}x{c.block_f}x{c.block_c}")
    return " ".join(parts)


def build_case(d: CaseDef, seed: int) -> Case:
  """Materializes a `CaseDef` into a `Case` with deterministic random arrays."""
  keys = inputs.Keys(seed, "conv2d " + d.name)
  cg = d.c // d.groups
  x = inputs.normal(keys.next(), (d.n, d.h, d.w, d.c), d.dtype)
  w = (jax.random.normal(keys.next(), (d.kh, d.kw, cg, d.f), jnp.float32)
       / math.sqrt(d.kh * d.kw * cg)).astype(d.dtype)
  args: list[Any] = [x, w]
  stride = reference.pair(d.stride, "stride")
  dilation = reference.pair(d.dilation, "dilation")
  pads = reference.resolve_padding(d.padding, (d.h, d.w), (d.kh, d.kw), stride, dilation)
  ho, wo = reference.output_hw((d.h, d.w), (d.kh, d.kw), stride, dilation, pads)
  shapes = {"scale": (d.c,), "shift": (d.c,), "bias": (d.f,), "residual": (d.n, ho, wo, d.f)}
  for name in d.arrays:
    a = inputs.normal(keys.next(), shapes[name], d.dtype)
    # A batch norm's scale is gamma * rsqrt(var): positive and O(1).
    args.append(jnp.abs(a) + 0.5 if name == "scale" else a)
  kwargs: dict[str, Any] = {"operands": d.arrays, "stride": d.stride, "padding": d.padding,
                            "dilation": d.dilation, "groups": d.groups}
  for key in ("prologue_activation", "activation", "out_dtype", "config"):
    if getattr(d, key) is not None:
      kwargs[key] = getattr(d, key)
  if d.statistics:
    kwargs["statistics"] = True
  return Case(name=d.name, args=tuple(args), kwargs=kwargs, tags=d.tags,
              grad_argnums=tuple(range(len(args))) if d.grad else ())


_CI = frozenset({"ci"})
_CI_GRAD = frozenset({"ci", "grad"})
_BENCH = frozenset({"bench"})

CASE_DEFS: tuple[CaseDef, ...] = (
    # The BN -> relu -> pad -> conv block: the prologue, the padding after it
    # (shift != 0, so act(shift) in the border would show), several tiles.
    CaseDef(2, 7, 9, 6, 10, prologue="affine", prologue_activation="relu", bias=True,
            config=SMALL, tags=_CI_GRAD, grad=True),
    # Stride 2, SAME padding with odd sizes (pad 0 on top, 1 at the bottom).
    CaseDef(1, 9, 11, 5, 12, stride=2, prologue="affine", prologue_activation="hard_swish",
            bias=True, activation="hard_swish", config=SMALL),
    # Dilation with explicit, lopsided padding.
    CaseDef(1, 10, 8, 4, 8, dilation=2, padding=((3, 1), (0, 2)), prologue="shift",
            prologue_activation="silu", activation="relu6", config=SMALL),
    # VALID, a 1x1 projection with a residual and statistics, bf16.
    CaseDef(2, 6, 5, 16, 24, kh=1, kw=1, padding="VALID", dtype="bfloat16", residual=True,
            statistics=True, tags=_CI_GRAD, grad=True),
    # Depthwise 3x3 stride 2 (MobileNet), BN + hard_swish prologue, statistics.
    CaseDef(1, 9, 9, 12, 12, stride=2, groups=12, prologue="affine",
            prologue_activation="hard_swish", bias=True, activation="hard_sigmoid",
            statistics=True, config=SMALL, tags=_CI_GRAD, grad=True),
    # Depthwise with a channel multiplier of 2, bf16.
    CaseDef(1, 8, 7, 6, 12, kh=5, kw=5, groups=6, dtype="bfloat16", prologue="scale",
            prologue_activation="relu", bias=True, activation="gelu"),
    # Grouped (not depthwise): 3 groups of 4 input and 6 output channels.
    CaseDef(2, 6, 6, 12, 18, stride=(1, 2), groups=3, bias=True, activation="silu",
            residual=True, statistics=True, config=SMALL, tags=_CI_GRAD, grad=True),
    CaseDef(1, 5, 7, 8, 16, dtype="float16", prologue="affine", prologue_activation="tanh",
            activation="sigmoid", out_dtype="float32"),
    CaseDef(1, 7, 7, 8, 8, kh=3, kw=1, dtype="bfloat16", prologue="affine",
            prologue_activation="relu", activation="gelu_tanh", out_dtype="float32",
            statistics=True),
    # MobileNetV3-ish layers at batch 32 (bench sizes).
    CaseDef(32, 56, 56, 72, 72, kh=5, kw=5, stride=2, groups=72, dtype="bfloat16",
            prologue="affine", prologue_activation="relu", statistics=True, tags=_BENCH),
    CaseDef(32, 28, 28, 40, 120, kh=1, kw=1, dtype="bfloat16", prologue="affine",
            prologue_activation="hard_swish", statistics=True, tags=_BENCH),
    CaseDef(32, 14, 14, 112, 112, kh=3, kw=3, groups=112, dtype="bfloat16",
            prologue="affine", prologue_activation="hard_swish", statistics=True,
            tags=_BENCH),
    # A ResNet-50 stage-3 3x3 conv with bias, relu, residual.
    CaseDef(32, 28, 28, 128, 128, dtype="bfloat16", prologue="affine",
            prologue_activation="relu", bias=True, activation="relu", residual=True,
            tags=_BENCH),
)


def cases(tag: str, seed: int) -> Iterator[Case]:
  """Yields the cases carrying `tag`, arrays drawn deterministically from `seed`."""
  for d in CASE_DEFS:
    if tag in d.tags:
      yield build_case(d, seed)


def _split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, dict[str, Any],
                                                                   dict[str, Any]]:
  """(x, w, the optional arrays by name, the other keywords)."""
  options = dict(kwargs)
  names = tuple(options.pop("operands", ()))
  if len(args) != 2 + len(names):
    raise TypeError(f"conv2d case: {len(args)} arrays for x, w and {names}")
  return args[0], args[1], dict(zip(names, args[2:])), options


def call(*args: Any, implementation: str | None = None, **kwargs: Any):
  """`OpSpec.fn`: `conv2d` with positional (x, w, *the `operands` arrays)."""
  x, w, arrays, options = _split(args, kwargs)
  return conv2d(x, w, implementation=implementation, **arrays, **options)


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in kwargs.items() if k not in _IMPL_KEYWORDS}


def reference_f32(*args: Any, **kwargs: Any):
  """`OpSpec.reference_f32`: float32 operands at Precision.HIGHEST, no final cast."""
  x, w, arrays, options = _split(args, kwargs)
  return reference.conv2d_f32(x, w, **arrays, **_options(options))


def xla_baseline(*args: Any, **kwargs: Any):
  """`OpSpec.baseline`: the block as a user writes it in jnp: the prologue,
  jnp.pad, lax.conv, the epilogue, jnp.sum for the statistics."""
  x, w, arrays, options = _split(args, kwargs)
  return reference.conv2d(x, w, **arrays, **_options(options))


def _nbytes(a: Any) -> int:
  return math.prod(a.shape) * jnp.dtype(a.dtype).itemsize


def bytes_moved(case: Case) -> int:
  """Every array argument read once, the outputs written once."""
  out = jax.eval_shape(lambda *a: reference_f32(*a, **case.kwargs), *case.args)
  odt = jnp.dtype(case.kwargs.get("out_dtype") or case.args[0].dtype)
  leaves = jax.tree_util.tree_leaves(out)
  written = math.prod(leaves[0].shape) * odt.itemsize + sum(_nbytes(o) for o in leaves[1:])
  return int(sum(_nbytes(a) for a in case.args) + written)


def flops(case: Case) -> int:
  """2 * N * HO * WO * F * KH * KW * C/G (the prologue and epilogue left out)."""
  w = case.args[1]
  out = jax.eval_shape(lambda *a: reference_f32(*a, **case.kwargs), *case.args)
  y = jax.tree_util.tree_leaves(out)[0]
  kh, kw, cg, _ = w.shape
  return int(2 * math.prod(y.shape) * kh * kw * cg)


# --------------------------------------------------------- sweeps ----


def make_case(*, seed: int, tags=(), grad: bool = False, n: int, h: int, w: int, c: int,
              f: int, kh: int = 3, kw: int = 3, stride: int = 1, padding: str = "SAME",
              dilation: int = 1, groups: int = 1, dtype: str = "float32",
              prologue_activation: str | None = None, affine: bool = False,
              bias: bool = False, activation: str | None = None, residual: bool = False,
              statistics: bool = False, out_dtype: str | None = None) -> Case:
  """The case at one sweep point (`affine`: a scale and shift prologue)."""
  d = CaseDef(n=n, h=h, w=w, c=c, f=f, kh=kh, kw=kw, stride=stride, padding=padding,
              dilation=dilation, groups=groups, dtype=dtype,
              prologue="affine" if affine else None,
              prologue_activation=prologue_activation, bias=bias, activation=activation,
              residual=residual, statistics=statistics, out_dtype=out_dtype,
              tags=frozenset(tags), grad=grad)
  return build_case(d, seed)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("n", "int", 32), SweepParam("h", "int", 28), SweepParam("w", "int", 28),
    SweepParam("c", "int", 64), SweepParam("f", "int", 64), SweepParam("kh", "int", 3),
    SweepParam("kw", "int", 3), SweepParam("stride", "int", 1),
    SweepParam("padding", "str", "SAME"), SweepParam("dilation", "int", 1),
    SweepParam("groups", "int", 1), SweepParam("dtype", "dtype", "float32"),
    SweepParam("grad", "bool", False),
    SweepParam("prologue_activation", "str", None, optional=True),
    SweepParam("affine", "bool", False), SweepParam("bias", "bool", False),
    SweepParam("activation", "str", None, optional=True),
    SweepParam("residual", "bool", False), SweepParam("statistics", "bool", False),
    SweepParam("out_dtype", "dtype", None, optional=True))


# ---------------------------------------------------- the audit's call ----

CLOSES = Closes(
    kinds=frozenset({"unfused-prologue", "unfused-epilogue", "separate-reduction"}),
    anchors=frozenset({"convolution"}),
    prologues=frozenset({"affine", "scale", "activation", "pad", "cast"}),
    epilogues=frozenset({"bias", "activation", "residual", "cast", "batch_norm_stats"}),
    activations=frozenset(reference.ACTIVATIONS),
    # A prologue's activation is `prologue_activation`, an epilogue's `activation`.
    keywords=(("affine", "scale"), ("scale", "scale"), ("activation", "activation"),
              ("activation", "prologue_activation"), ("pad", "padding"),
              ("bias", "bias"), ("residual", "residual"), ("cast", "out_dtype"),
              ("batch_norm_stats", "statistics")),
    outputs=1)


def _stride(padded: int, window: int, out: int) -> int | None:
  """The one stride that makes `out` windows of `window` in `padded`, else None."""
  fits = [s for s in range(1, max(padded, 1) + 1) if (padded - window) // s + 1 == out]
  return fits[0] if len(fits) == 1 else None


def _dims(dims) -> str:
  return ",".join(map(str, dims))


def _filter(rhs: tuple[int, ...], c: int, hw: tuple[int, int], f: int | None
            ) -> tuple[int, int, int, int] | None:
  """(KH, KW, C/G, F) of a filter stored HWIO (as JAX writes it) or OHWI (as
  XLA:GPU hands it to cuDNN for NHWC activations; preferred): a reading whose
  groups divide C, whose window fits the input and whose F is `f` (when the
  boundary says); None when neither fits."""
  # OHWI first: an anchor is a cuDNN call, whose NHWC filters XLA stores so.
  readings = ((rhs[1], rhs[2], rhs[3], rhs[0]), (rhs[0], rhs[1], rhs[2], rhs[3]))
  fits = [(kh, kw, cg, ff) for kh, kw, cg, ff in readings
          if cg and c % cg == 0 and ff % (c // cg) == 0 and kh <= hw[0] and kw <= hw[1]
          and (f is None or ff == f)]
  return fits[0] if fits else None


def _epilogue_items(facts: CallFacts, f: int, bdims: tuple[int, ...]):
  """An epilogue's (or a statistic's) arrays and options from the finding's
  work: (arrays, options, the cast's dtype or None, statistics); None for an
  activation the op lacks."""
  arrays: list[tuple[str, str, tuple[int, ...], bool]] = []
  options: list[tuple[str, str, object]] = []
  cast, stats = None, False
  for item in facts.ops:
    base, _, arg = item.partition(":")
    if base == "bias":
      arrays.append(("bias", facts.boundary.dtype, (f,), False))
    elif base == "activation":
      if arg not in reference.ACTIVATIONS:
        return None
      options.append(("activation", repr(arg), arg))
    elif base == "residual":
      arrays.append(("residual", facts.boundary.dtype, bdims, False))
    elif base == "cast" and arg:
      name = facts.numpy_name(arg)
      options.append(("out_dtype", f"jnp.{name}", name))
      cast = arg
    elif base == "batch_norm_stats":
      stats = True
  return arrays, options, cast, stats


def suggest(facts: CallFacts) -> Call | None:
  """`conv2d(x, w, ...)` from what the audit read.

  The convolution is the anchor: a cuDNN convolution call reads as a library
  call (`facts.matmul`: lhs its NHWC input, rhs its filter, HWIO or OHWI);
  XLA's `convolution` instruction gives no anchor (None), and then the filter
  is unknown: no call. A prologue's boundary is the (padded) input the
  convolution reads, its 4-D source the unpadded x and its [C] sources the
  scale and shift; an epilogue's boundary is the convolution's output. What
  the shapes leave open is named in the call instead of guessed: the split
  of a pad between the two sides (`padding=((top, bottom), (left, right))`),
  the padding a convolution call applies itself (`padding=padding`, for
  windows past 1x1), the stride where the sizes do not fix it
  (`stride=stride`) and the output size when the call's result is not in
  the HLO (a cuDNN call returns a tuple: `[N,HO,WO,F]`).
  None for a layout the op does not take or an activation it lacks.
  """
  if facts.convolution is not None:
    return _from_convolution(facts)
  anchor = facts.matmul
  # (Without the convolution's facts a statistic's call is not written.)
  if facts.kind not in ("unfused-prologue", "unfused-epilogue") or anchor is None:
    return None
  lhs, rhs = anchor.lhs, anchor.rhs
  if len(lhs.dims) != 4 or len(rhs.dims) != 4:
    return None
  n, hp, wp, c = (int(d) for d in lhs.dims)
  bdims = tuple(int(d) for d in facts.boundary.dims)
  epilogue = facts.kind == "unfused-epilogue"
  if epilogue and (len(bdims) != 4 or bdims[0] != n):
    return None
  found = _filter(tuple(int(d) for d in rhs.dims), c, (hp, wp), bdims[3] if epilogue else None)
  if found is None:
    return None
  kh, kw, cg, f = found
  groups = c // cg
  x_dt, x_dims = lhs.dtype, (n, hp, wp, c)
  arrays: list[tuple[str, str, tuple[int, ...], bool]] = []
  options: list[tuple[str, str, object]] = []
  result_dt = facts.boundary.dtype
  padding: tuple[str, object] = ("'VALID'", "VALID")
  stats = False
  out_hw: tuple[Any, Any] | None = None
  if epilogue:
    out_hw = bdims[1], bdims[2]
  elif anchor.result and len(anchor.result) == 4:
    out_hw = int(anchor.result[1]), int(anchor.result[2])
  padded = any(item == "pad" for item in facts.ops)
  if not epilogue:
    if bdims != x_dims:
      return None

    def is_x(a) -> bool:
      d = tuple(int(v) for v in a.dims)
      return (len(d) == 4 and d[0] == n and d[3] == c and
              (d[1] <= hp and d[2] <= wp if padded else d == x_dims))

    src = [a for a in facts.sources if is_x(a)]
    # Anything else but [C] vectors and scalars (a squeeze-excite's
    # per-sample [N,1,1,C] factor) is not a per-channel prologue.
    if len(src) > 1 or any(not is_x(a) and tuple(a.dims) != (c,) and math.prod(a.dims) != 1
                           for a in facts.sources):
      return None
    if src:
      x_dt, x_dims = src[0].dtype, tuple(int(d) for d in src[0].dims)
    pad_h, pad_w = hp - x_dims[1], wp - x_dims[2]
    if pad_h > 2 * (kh - 1) or pad_w > 2 * (kw - 1):
      # Zeros past a window's reach: interior padding (a transposed
      # convolution's, in a backward pass), which this op does not compute.
      return None
    if pad_h or pad_w:
      padding = ("((top, bottom), (left, right))",
                 ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2)))
    vectors = [a for a in facts.sources if tuple(a.dims) == (c,)]
    vdt = vectors[0].dtype if vectors else "f32"
    result_dt = lhs.dtype  # the convolution's (XLA's output is its input's dtype)
    for item in facts.ops:
      base, _, arg = item.partition(":")
      if base in ("affine", "scale"):
        arrays.append(("scale", vdt, (c,), False))
      if base in ("affine", "bias"):
        arrays.append(("shift", vdt, (c,), False))
      if base == "activation":
        if arg not in reference.ACTIVATIONS:
          return None
        options.append(("prologue_activation", repr(arg), arg))
  else:
    found = _epilogue_items(facts, f, bdims)
    if found is None:
      return None
    arrays, options, cast, stats = found
    result_dt = cast or result_dt
  lead: list[tuple[str, str, object]] = []
  if not padded and (kh, kw) != (1, 1):
    # A convolution call pads its input itself; how much is not in the shapes.
    padding = ("padding", "SAME")
  solved = None
  if out_hw is not None and padding[0] != "padding":  # the padded extent is hp, wp
    solved = _stride(hp, kh, out_hw[0]), _stride(wp, kw, out_hw[1])
  if solved is not None and None not in solved:
    if solved != (1, 1):
      stride = solved[0] if solved[0] == solved[1] else solved
      lead.append(("stride", repr(stride), stride))
  elif (hp, wp) != (kh, kw):  # else one window: any stride gives [1, 1]
    lead.append(("stride", "stride", 1))
  if out_hw is None:
    out_hw = ("HO", "WO") if (hp, wp) != (kh, kw) else (1, 1)
  lead.append(("padding", *padding))
  if groups != 1:
    lead.append(("groups", str(groups), groups))
  if stats:
    options.append(("statistics", "True", True))
  call_arrays = [("x", x_dt, x_dims, True), ("w", rhs.dtype, (kh, kw, cg, f), True)]
  result = f"{result_dt}[{_dims((n, *out_hw, f))}]"
  if stats:
    result = f"({result}, (f32[{f}], f32[{f}]))"
  return Call("conv2d", tuple(call_arrays + arrays), tuple(lead + options), result)


def _pair(values) -> tuple[str, object]:
  """An option's (text, value): one int where both spatial values agree."""
  values = tuple(values)
  one = values[0] if len(set(values)) == 1 else values
  return repr(one), one


def _from_convolution(facts: CallFacts) -> Call | None:
  """The call from the convolution the audit read (`facts.convolution`:
  its x, w and y, window and groups) and, for a prologue, the producer's
  pad: every option from the HLO, nothing named for the user to fill in.
  None where the op does not compute it (a backward convolution call, a
  transposed convolution's holes, a layout the boundary does not match)."""
  conv = facts.convolution
  x_dims, w_dims, y_dims = (tuple(int(d) for d in a.dims)
                            for a in (conv.input, conv.kernel, conv.output))
  if conv.role != "forward" or len(x_dims) != 4 or set(conv.input_dilation) != {1}:
    return None
  n, _, _, c = x_dims
  kh, kw, cg, f = w_dims
  bdims = tuple(int(d) for d in facts.boundary.dims)
  padding = tuple(tuple(p) for p in conv.padding)
  x_dt, x_src = conv.input.dtype, x_dims
  arrays: list[tuple[str, str, tuple[int, ...], bool]] = []
  options: list[tuple[str, str, object]] = []
  result_dt, stats = conv.output.dtype, False
  if facts.kind == "unfused-prologue":
    if bdims != x_dims:
      return None
    if "pad" in facts.ops:
      if facts.pad is None:
        return None
      src, widths = facts.pad
      widths = tuple(tuple(w) for w in widths)
      if len(widths) != 4 or widths[0] != (0, 0) or widths[3] != (0, 0):
        return None  # zeros beside the batch or the channels: no window's
      x_src = tuple(int(d) for d in src.dims)
      padding = tuple((lo + plo, hi + phi) for (lo, hi), (plo, phi) in zip(widths[1:3], padding))
    # Sources: x (before the pad), [C] vectors, scalars; anything else (a
    # squeeze-excite's per-sample [N,1,1,C] factor) is no per-channel work.
    vectors = [a for a in facts.sources if tuple(a.dims) == (c,)]
    for a in facts.sources:
      d = tuple(int(v) for v in a.dims)
      if d == x_src:
        x_dt = a.dtype
      elif d != (c,) and math.prod(d) != 1:
        return None
    vdt = vectors[0].dtype if vectors else "f32"
    for item in facts.ops:
      base, _, arg = item.partition(":")
      if base in ("affine", "scale"):
        arrays.append(("scale", vdt, (c,), False))
      if base in ("affine", "bias"):
        arrays.append(("shift", vdt, (c,), False))
      if base == "activation":
        if arg not in reference.ACTIVATIONS:
          return None
        options.append(("prologue_activation", repr(arg), arg))
  elif facts.kind in ("unfused-epilogue", "separate-reduction"):
    found = _epilogue_items(facts, f, bdims) if bdims == y_dims else None
    if found is None:
      return None
    arrays, options, cast, stats = found
    result_dt = cast or result_dt
  else:
    return None
  lead: list[tuple[str, str, object]] = []
  if set(conv.stride) != {1}:
    lead.append(("stride", *_pair(conv.stride)))
  if any(lo or hi for lo, hi in padding):
    lead.append(("padding", repr(padding), padding))
  else:
    lead.append(("padding", "'VALID'", "VALID"))
  if set(conv.dilation) != {1}:
    lead.append(("dilation", *_pair(conv.dilation)))
  if conv.groups != 1:
    lead.append(("groups", str(conv.groups), conv.groups))
  if stats:
    options.append(("statistics", "True", True))
  result = f"{result_dt}[{_dims((n, y_dims[1], y_dims[2], f))}]"
  if stats:
    result = f"({result}, (f32[{f}], f32[{f}]))"
  call_arrays = [("x", x_dt, (n, *x_src[1:3], c), True),
                 ("w", conv.kernel.dtype, (kh, kw, cg, f), True)]
  return Call("conv2d", tuple(call_arrays + arrays), tuple(lead + options), result)


SPEC = OpSpec(
    name="conv2d",
    fn=call,
    reference_f32=reference_f32,
    cases=cases,
    bytes_moved=bytes_moved,
    flops=flops,
    baseline=xla_baseline,
    api=conv2d,
    closes=CLOSES,
    sweep_params=SWEEP_PARAMS,
    make_case=make_case,
    suggest=suggest,
)
