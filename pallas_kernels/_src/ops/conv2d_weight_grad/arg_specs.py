"""conv2d_weight_grad's `SPEC`: cases for `validate`, `bench` and the tests, its
cost model, sweep parameters, and the audit finding it closes with the call it
suggests (`spec.py`).

Positional arguments of a case are (x, dy); the window (kernel_size, stride,
padding, dilation, groups), column_sum, out_dtype and config are keywords,
and so is the optimizer state of an Adam case (param, mu, nu, count,
learning_rate, weight_decay). Shapes are odd and ragged against the blocks;
no gradients are checked: the op is itself a gradient and defines none.

Adam cases draw the state as adam_matmul's do (mu ~ 0.1 N(0, 1), nu ~ 0.01
|N(0, 1)|) with its learning rate, 1e-2, large enough that a wrong term of
the update moves param' past float32's tolerance; the tolerances are
`tolerances.py`'s for each output's dtype, as adam_matmul's are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import inputs
from pallas_kernels._src.ops import adam_reference
from pallas_kernels._src.ops.conv2d_weight_grad import reference
from pallas_kernels._src.ops.conv2d_weight_grad.api import conv2d_weight_grad
from pallas_kernels._src.ops.conv2d_weight_grad.config import Config
from pallas_kernels._src.spec import Call, CallFacts, Case, Closes, OpSpec, SweepParam

#: Keywords that steer the implementation, not the math.
_IMPL_KEYWORDS = ("implementation", "interpret", "config")
_WINDOW_KEYWORDS = ("kernel_size", "stride", "padding", "dilation", "groups")
#: Adam's constants among a case's keywords.
_HYPER_KEYWORDS = ("b1", "b2", "eps", "eps_root", "weight_decay")
#: Small blocks: several C and F tiles, ragged pixel tiles and two splits on
#: CI shapes (the partial sums' combine included).
SMALL = Config(block_p=16, block_c=4, block_f=4, splits=2)
#: SMALL with one split, as the Adam update takes it.
SMALL_ADAM = Config(block_p=16, block_c=4, block_f=4, splits=1)
#: The learning rate of the Adam cases.
LEARNING_RATE = 1e-2


@dataclasses.dataclass(frozen=True, slots=True)
class CaseDef:
  """A case before its arrays exist."""

  #: x's [N, H, W, C].
  x: tuple[int, int, int, int]
  kernel: tuple[int, int]
  f: int
  dtype: str = "float32"
  stride: int | tuple[int, int] = 1
  padding: Any = "SAME"
  dilation: int | tuple[int, int] = 1
  groups: int = 1
  column_sum: bool = False
  out_dtype: str | None = None
  #: Adam's update on the gradient: the state's dtype, else None.
  adam: str | None = None
  count: int = 0
  weight_decay: float = 0.0
  config: Config | None = None
  tags: frozenset[str] = frozenset({"ci"})

  def window(self) -> reference.Window:
    return reference.window(self.x, self.kernel, stride=self.stride, padding=self.padding,
                            dilation=self.dilation, groups=self.groups)

  @property
  def dy_shape(self) -> tuple[int, int, int, int]:
    ho, wo = self.window().out_size(self.x[1], self.x[2])
    return (self.x[0], ho, wo, self.f)

  @property
  def name(self) -> str:
    parts = [inputs.describe("x", self.x, self.dtype),
             inputs.describe("dy", self.dy_shape, self.dtype),
             f"k{self.kernel[0]}x{self.kernel[1]}"]
    if self.stride != 1:
      parts.append(f"stride:{self.stride}")
    if self.dilation != 1:
      parts.append(f"dilation:{self.dilation}")
    parts.append(self.padding if isinstance(self.padding, str) else f"pad:{self.padding}")
    if self.groups != 1:
      parts.append("depthwise" if self.groups == self.x[3] else f"groups:{self.groups}")
    if self.column_sum:
      parts.append("column_sum")
    if self.out_dtype:
      parts.append(f"out:{inputs.short_dtype(self.out_dtype)}")
    if self.adam:
      parts.append(f"adam:{inputs.short_dtype(self.adam)} count={self.count}")
      if self.weight_decay:
        parts.append(f"wd={self.weight_decay:g}")
    if self.config is not None:
      c = self.config
      parts.append(f"blocks:{c.block_p}x{c.block_c}x{c.block_f}/{c.splits}")
    return " ".join(parts)


def build_case(d: CaseDef, seed: int) -> Case:
  """Materializes a `CaseDef` into a `Case` with deterministic random arrays."""
  keys = inputs.Keys(seed, "conv2d_weight_grad " + d.name)
  x = inputs.normal(keys.next(), d.x, d.dtype)
  dy = inputs.normal(keys.next(), d.dy_shape, d.dtype)
  kwargs: dict[str, Any] = {"kernel_size": d.kernel, "stride": d.stride,
                            "padding": d.padding, "dilation": d.dilation,
                            "groups": d.groups}
  if d.column_sum:
    kwargs["column_sum"] = True
  if d.out_dtype:
    kwargs["out_dtype"] = d.out_dtype
  if d.adam:
    shape = d.kernel + (d.x[3] // d.groups, d.f)
    kwargs["param"] = inputs.normal(keys.next(), shape, d.adam)
    kwargs["mu"] = (0.1 * jax.random.normal(keys.next(), shape, jnp.float32)).astype(d.adam)
    kwargs["nu"] = (0.01 * jnp.abs(jax.random.normal(keys.next(), shape, jnp.float32))
                    ).astype(d.adam)
    kwargs["count"] = jnp.asarray(d.count, jnp.int32)
    kwargs["learning_rate"] = LEARNING_RATE
    if d.weight_decay:
      kwargs["weight_decay"] = d.weight_decay
  if d.config is not None:
    kwargs["config"] = d.config
  return Case(name=d.name, args=(x, dy), kwargs=kwargs, tags=d.tags)


_CI = frozenset({"ci"})
_BENCH = frozenset({"bench"})

CASE_DEFS: tuple[CaseDef, ...] = (
    # Stride 2 with SAME padding on odd sizes; ragged pixel, C and F tiles.
    CaseDef((2, 7, 9, 5), (3, 3), 6, stride=2, column_sum=True, config=SMALL),
    CaseDef((2, 7, 9, 5), (3, 3), 6, stride=2, column_sum=True),
    # Dilation (one axis) with VALID padding.
    CaseDef((1, 9, 8, 4), (3, 2), 8, dilation=(2, 1), padding="VALID", config=SMALL),
    # Explicit, asymmetric padding and a per-axis stride.
    CaseDef((1, 6, 7, 4), (3, 3), 8, stride=(1, 2), padding=((2, 0), (1, 3))),
    # Depthwise with a channel multiplier of 2, and its column sum.
    CaseDef((2, 6, 6, 6), (3, 3), 12, stride=2, groups=6, column_sum=True,
            config=Config(block_p=16, block_f=8, splits=2)),
    # Grouped: two groups of 4 input and 3 output channels.
    CaseDef((2, 6, 5, 8), (3, 3), 6, groups=2, column_sum=True, config=SMALL),
    # 16-bit inputs, f32 accumulation; dw in the input dtype or in f32.
    CaseDef((2, 7, 9, 5), (3, 3), 6, "bfloat16", stride=2, column_sum=True, config=SMALL),
    CaseDef((2, 5, 6, 8), (1, 1), 16, "bfloat16", padding="VALID", out_dtype="float32"),
    CaseDef((1, 6, 6, 8), (3, 3), 8, "float16", groups=8, column_sum=True),
    # Adam's update as the epilogue: ragged pixel, C and F tiles at stride 2,
    # SAME; a depthwise layer with its column sum; explicit asymmetric
    # padding with weight decay; bf16 gradients into f32 state, and bf16
    # state.
    CaseDef((2, 7, 9, 5), (3, 3), 6, stride=2, adam="float32", config=SMALL_ADAM),
    CaseDef((2, 6, 6, 6), (3, 3), 12, stride=2, groups=6, column_sum=True, adam="float32",
            count=7, config=Config(block_p=16, block_f=8)),
    CaseDef((1, 6, 7, 4), (3, 3), 8, stride=(1, 2), padding=((2, 0), (1, 3)),
            adam="float32", count=2, weight_decay=0.1, config=SMALL_ADAM),
    CaseDef((2, 6, 5, 8), (3, 3), 6, "bfloat16", groups=2, adam="float32", count=1,
            config=SMALL_ADAM),
    CaseDef((2, 5, 6, 8), (1, 1), 16, "bfloat16", padding="VALID", adam="bfloat16",
            count=3, weight_decay=1e-2),
    # MobileNetV3 (224x224, batch 64): the stem, a 1x1 expansion, a depthwise 3x3.
    CaseDef((64, 224, 224, 3), (3, 3), 16, "bfloat16", stride=2, column_sum=True,
            tags=_BENCH),
    CaseDef((64, 56, 56, 24), (1, 1), 72, "bfloat16", column_sum=True, tags=_BENCH),
    CaseDef((64, 56, 56, 72), (3, 3), 72, "bfloat16", stride=2, groups=72,
            column_sum=True, tags=_BENCH),
    # keras' MobileNetV3 step (batch 8, f32) with Adam: a 1x1 projection, a
    # strided depthwise 5x5.
    CaseDef((8, 4, 4, 120), (1, 1), 48, padding="VALID", adam="float32", count=7,
            tags=_BENCH),
    CaseDef((8, 11, 11, 96), (5, 5), 96, stride=2, padding="VALID", groups=96,
            adam="float32", count=7, tags=_BENCH),
)


def cases(tag: str, seed: int) -> Iterator[Case]:
  """Yields the cases carrying `tag`, arrays drawn deterministically from `seed`."""
  for d in CASE_DEFS:
    if tag in d.tags:
      yield build_case(d, seed)


def _window_of(kwargs: dict[str, Any], x) -> reference.Window:
  options = {k: kwargs[k] for k in _WINDOW_KEYWORDS[1:] if k in kwargs}
  return reference.window(x.shape, kwargs["kernel_size"], **options)


def call(x, dy, *, implementation: str | None = None, **kwargs: Any):
  """`OpSpec.fn`: `conv2d_weight_grad` with positional (x, dy)."""
  kernel_size = kwargs.pop("kernel_size")
  return conv2d_weight_grad(x, dy, kernel_size, implementation=implementation, **kwargs)


def _adam_options(kwargs: dict[str, Any]) -> dict[str, Any]:
  """The learning rate and Adam's constants a case passes."""
  return {k: kwargs[k] for k in ("learning_rate",) + _HYPER_KEYWORDS if k in kwargs}


def _state(kwargs: dict[str, Any]) -> tuple[Any, ...]:
  return tuple(kwargs[k] for k in ("param", "mu", "nu", "count"))


def reference_f32(x, dy, **kwargs: Any):
  """`OpSpec.reference_f32`: float32 operands at Precision.HIGHEST, no final cast."""
  win, column_sum = _window_of(kwargs, x), bool(kwargs.get("column_sum"))
  if "param" in kwargs:
    return reference.adam_step_f32(x, dy, win, *_state(kwargs), column_sum_=column_sum,
                                   **_adam_options(kwargs))
  return reference.conv2d_weight_grad_f32(x, dy, win, column_sum_=column_sum)


def xla_baseline(x, dy, **kwargs: Any):
  """`OpSpec.baseline`: what plain JAX gets: jax.vjp of the convolution with
  respect to w, and a separate jnp.sum of dy for the bias gradient; with the
  optimizer state, the gradient (in x's dtype, cast to f32) then the update
  as a separate elementwise step, as a training step writes it."""
  win = _window_of(kwargs, x)
  db = (reference.column_sum(dy),) if kwargs.get("column_sum") else ()
  if "param" in kwargs:
    param, mu, nu, count = _state(kwargs)
    g = reference.weight_grad(x, dy, win).astype(jnp.float32)
    new = adam_reference.step(g, param, mu, nu, count, **_adam_options(kwargs))
    return adam_reference.cast_like(new, (param, mu, nu)) + db
  dw = reference.weight_grad(x, dy, win).astype(kwargs.get("out_dtype") or x.dtype)
  return (dw, *db) if db else dw


def bytes_moved(case: Case) -> int:
  """x and dy read once, dw (and db) written once; with the optimizer state,
  param, mu and nu read and written once each instead of dw."""
  x, dy = case.args
  kh, kw = case.kwargs["kernel_size"]
  groups = case.kwargs.get("groups", 1)
  total = (math.prod(x.shape) + math.prod(dy.shape)) * jnp.dtype(x.dtype).itemsize
  if "param" in case.kwargs:
    total += 2 * sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize
                     for a in _state(case.kwargs)[:3])
  else:
    out = jnp.dtype(case.kwargs.get("out_dtype") or x.dtype).itemsize
    total += kh * kw * (x.shape[-1] // groups) * dy.shape[-1] * out
  if case.kwargs.get("column_sum"):
    total += 4 * dy.shape[-1]
  return int(total)


def flops(case: Case) -> int:
  """2 * N*HO*WO * KH*KW * C/groups * F (the column sum's N*HO*WO*F adds and
  the update's O(KH*KW*C/groups*F) left out)."""
  x, dy = case.args
  kh, kw = case.kwargs["kernel_size"]
  groups = case.kwargs.get("groups", 1)
  return int(2 * math.prod(dy.shape[:3]) * kh * kw * (x.shape[-1] // groups) * dy.shape[-1])


# --------------------------------------------------------- sweeps ----


def make_case(*, seed: int, tags=(), grad: bool = False, n: int, h: int, w: int, c: int,
              f: int, kernel: int = 3, stride: int = 1, padding: str = "SAME",
              dilation: int = 1, groups: int = 1, dtype: str = "float32",
              column_sum: bool = False, out_dtype: str | None = None,
              adam: str | None = None) -> Case:
  """The case at one sweep point (square kernel, stride and dilation;
  `adam`: the dtype of the optimizer state when the update is the epilogue).

  Raises:
    ValueError: for gradients (the op defines none), groups not dividing C
      and F, or out_dtype with the update (nothing returns dw).
  """
  if grad:
    raise ValueError("conv2d_weight_grad is itself a gradient: no gradients to check")
  if c % groups or f % groups:
    raise ValueError(f"groups={groups} must divide c={c} and f={f}")
  if adam and out_dtype:
    raise ValueError("out_dtype is dw's dtype: with adam nothing returns dw")
  d = CaseDef((n, h, w, c), (kernel, kernel), f, dtype=dtype, stride=stride,
              padding=padding, dilation=dilation, groups=groups, column_sum=column_sum,
              out_dtype=out_dtype, adam=adam, count=1 if adam else 0,
              tags=frozenset(tags))
  return build_case(d, seed)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("n", "int", 8), SweepParam("h", "int", 28), SweepParam("w", "int", 28),
    SweepParam("c", "int", 32), SweepParam("f", "int", 32),
    SweepParam("kernel", "int", 3), SweepParam("stride", "int", 1),
    SweepParam("padding", "str", "SAME"), SweepParam("dilation", "int", 1),
    SweepParam("groups", "int", 1), SweepParam("dtype", "dtype", "float32"),
    SweepParam("column_sum", "bool", False),
    SweepParam("out_dtype", "dtype", None, optional=True),
    SweepParam("adam", "dtype", None, optional=True))


# ---------------------------------------------------- the audit's call ----

CLOSES = Closes(
    # The column sum of dy (a conv bias's or a batch/group-norm beta's
    # gradient) beside the weight-gradient convolution that reads dy whole.
    kinds=frozenset({"separate-reduction"}),
    anchors=frozenset({"convolution"}),
    epilogues=frozenset({"column_sum", "cast"}),
    keywords=(("column_sum", "column_sum"), ("cast", "out_dtype")),
    outputs=2)

ADAM_CLOSES = Closes(
    # Adam's update reading the filter gradient a convolution writes: the
    # parameter and both moments written where the gradient lies, the
    # parameter in HWIO whichever layout the convolution stored the gradient
    # in (so a transpose on the way to the update goes too).
    kinds=frozenset({"unfused-epilogue"}),
    anchors=frozenset({"convolution"}),
    epilogues=frozenset({"adam", "cast", "transpose"}),
    keywords=(("adam", "learning_rate"),),
    outputs=3,
    # Only an optimizer's update makes a convolution's epilogue this op's.
    requires=frozenset({"adam"}))


def _axis_windows(size: int, out: int, k: int) -> set[tuple[int, int, tuple[int, int]]]:
  """(stride, dilation, pads) along one axis under which a SAME or VALID
  convolution with a k-tap kernel maps `size` to `out`; the search stops at
  the second (the caller needs exactly one)."""
  found: set[tuple[int, int, tuple[int, int]]] = set()
  for s in range(1, size + 1):
    # A 1-tap kernel's dilation changes nothing; a wider span than x fits no window.
    for d in range(1, (size if k > 1 else 1) + 1):
      span = (k - 1) * d + 1
      # lax's SAME: ceil(size / s) outputs, the padding split low-first.
      same = max(0, (-(-size // s) - 1) * s + span - size)
      for lo, hi in ((same // 2, same - same // 2), (0, 0)):
        if size + lo + hi >= span and (size + lo + hi - span) // s + 1 == out:
          found.add((s, d, (lo, hi)))
          if len(found) > 1:
            return found
  return found


def suggest(facts: CallFacts) -> Call | None:
  """`conv2d_weight_grad(x, dy, kernel_size=(KH, KW), ..., column_sum=True)`
  for a column sum of dy (the boundary) beside the weight-gradient
  convolution reading it; `conv2d_weight_grad(x, dy, param=param, mu=mu,
  nu=nu, count=count, kernel_size=(KH, KW), ..., learning_rate=...)` for
  Adam's update reading the filter gradient a convolution writes (the
  boundary), see `_adam_call`.

  The call needs x and the kernel's size, and a window that x, dy and the
  kernel's size determine. The audit hands a convolution's finding with dy
  alone (`facts.matmul` is None): then None. Where an anchor names the
  convolution's input (`.lhs`, NHWC), dy (`.rhs`) and its weight gradient
  (`.result`, HWIO), the stride, dilation and SAME/VALID padding are read off
  the shapes when exactly one choice fits each axis (a 1x1 kernel, a VALID
  window); where several fit (a 3x3 SAME window fits every dilation), None:
  a guessed window would be an invented call.
  """
  if "adam" in facts.ops:
    return _adam_call(facts)
  if facts.kind != "separate-reduction" or "column_sum" not in facts.ops:
    return None
  if facts.convolution is not None:
    return _from_convolution(facts)
  dy, anchor = facts.boundary, facts.matmul
  if anchor is None or len(dy.dims) != 4:
    return None
  x, dw = anchor.lhs, tuple(getattr(anchor, "result", ()) or ())
  if len(x.dims) != 4 or tuple(anchor.rhs.dims) != tuple(dy.dims) or len(dw) != 4:
    return None
  n, h, w, c = (int(v) for v in x.dims)
  kh, kw, cg, f = (int(v) for v in dw)
  if n != dy.dims[0] or f != dy.dims[3] or not cg or c % cg or f % (c // cg):
    return None
  axes = []
  for size, out, k in ((h, dy.dims[1], kh), (w, dy.dims[2], kw)):
    found = _axis_windows(size, int(out), k)
    if len(found) != 1:
      return None
    axes.append(found.pop())
  (sh, dh, pad_h), (sw, dw_, pad_w) = axes
  pads = (pad_h, pad_w)
  options: list[tuple[str, str, object]] = [("kernel_size", f"({kh}, {kw})", (kh, kw))]
  if (sh, sw) != (1, 1):
    options.append(("stride", f"({sh}, {sw})", (sh, sw)))
  same = reference.window((n, h, w, c), (kh, kw), stride=(sh, sw), dilation=(dh, dw_),
                          padding="SAME").padding
  if pads == ((0, 0), (0, 0)):
    options.append(("padding", "'VALID'", "VALID"))
  elif pads == same:
    options.append(("padding", "'SAME'", "SAME"))
  else:
    options.append(("padding", repr(pads), pads))
  if (dh, dw_) != (1, 1):
    options.append(("dilation", f"({dh}, {dw_})", (dh, dw_)))
  groups = c // cg
  if groups != 1:
    options.append(("groups", str(groups), groups))
  options.append(("column_sum", "True", True))
  result_dt = x.dtype
  for item in facts.ops:
    base, _, arg = item.partition(":")
    if base == "cast" and arg:
      name = facts.numpy_name(arg)
      options.append(("out_dtype", f"jnp.{name}", name))
      result_dt = arg
  arrays = (("x", x.dtype, (n, h, w, c), True), ("dy", dy.dtype, tuple(dy.dims), True))
  return Call("conv2d_weight_grad", arrays, tuple(options),
              f"({result_dt}[{kh},{kw},{cg},{f}], f32[{f}])")


SPEC = OpSpec(
    name="conv2d_weight_grad",
    fn=call,
    reference_f32=reference_f32,
    cases=cases,
    bytes_moved=bytes_moved,
    flops=flops,
    baseline=xla_baseline,
    api=conv2d_weight_grad,
    closes=(CLOSES, ADAM_CLOSES),
    sweep_params=SWEEP_PARAMS,
    make_case=make_case,
    suggest=suggest,
)


def _from_convolution(facts: CallFacts) -> Call | None:
  """The call from the weight-gradient convolution the audit read
  (`facts.convolution`, role "backward_filter": x, dy and dW with the
  forward's window and groups); None for another role, a transposed
  convolution, or a dy that is not the boundary."""
  conv = facts.convolution
  x, dy, dw = (tuple(int(d) for d in a.dims) for a in (conv.input, conv.output, conv.kernel))
  if conv.role != "backward_filter" or len(x) != 4 or set(conv.input_dilation) != {1} or \
      tuple(int(d) for d in facts.boundary.dims) != dy:
    return None
  kh, kw, cg, f = dw
  options = _window_options((kh, kw), conv.stride, conv.padding, conv.dilation, conv.groups)
  options.append(("column_sum", "True", True))
  arrays = (("x", conv.input.dtype, x, True), ("dy", facts.boundary.dtype, dy, True))
  return Call("conv2d_weight_grad", arrays, tuple(options),
              f"({conv.kernel.dtype}[{kh},{kw},{cg},{f}], f32[{f}])")


def _window_options(kernel, stride, padding, dilation, groups
                    ) -> list[tuple[str, str, object]]:
  """The call's window keywords, as read off a convolution (explicit pads;
  'VALID' when there are none)."""
  kernel = tuple(int(k) for k in kernel)
  options: list[tuple[str, str, object]] = [("kernel_size", repr(kernel), kernel)]
  if set(stride) != {1}:
    options.append(("stride", repr(tuple(stride)), tuple(stride)))
  padding = tuple(tuple(int(v) for v in p) for p in padding)
  if any(lo or hi for lo, hi in padding):
    options.append(("padding", repr(padding), padding))
  else:
    options.append(("padding", "'VALID'", "VALID"))
  if set(dilation) != {1}:
    options.append(("dilation", repr(tuple(dilation)), tuple(dilation)))
  if groups != 1:
    options.append(("groups", str(groups), groups))
  return options


@dataclasses.dataclass(frozen=True, slots=True)
class _FilterGradient:
  """A convolution read as the filter gradient of the user's convolution:
  its x [N, H, W, C] and dy [N, HO, WO, F] (dtypes as XLA names them) and
  the user's window."""

  x: tuple[int, int, int, int]
  x_dtype: str
  dy: tuple[int, int, int, int]
  dy_dtype: str
  kernel: tuple[int, int]
  stride: tuple[int, int]
  padding: tuple[tuple[int, int], tuple[int, int]]
  dilation: tuple[int, int]
  groups: int

  @property
  def dw(self) -> tuple[int, int, int, int]:
    """The HWIO gradient's shape."""
    return (*self.kernel, self.x[3] // self.groups, self.dy[3])


def _filter_gradient(conv) -> _FilterGradient | None:
  """The filter gradient a convolution computes, or None where it reads as
  none (another role, a transposed convolution, shapes that do not fit).

  A backward-filter call names it directly. XLA also computes it as a
  forward convolution, as JAX's transpose rule writes it: x with its batch
  and channels exchanged, [C, H, W, N], convolved with dy as the kernel
  [HO, WO, N, F] into [C, KH, KW, F], the user's stride as the window's
  dilation and the user's dilation as its stride; a depthwise layer's is
  grouped, x as [1, H, W, C*N] in C groups, into [1, KH, KW, F]. The user's
  high padding is then the one that makes the convolution's HO x WO.
  """
  x, w, y = (tuple(int(d) for d in a.dims) for a in (conv.input, conv.kernel, conv.output))
  if len(x) != 4 or set(conv.input_dilation) != {1}:
    return None
  if conv.role == "backward_filter":
    found = _FilterGradient(x, conv.input.dtype, y, conv.output.dtype, w[:2],
                            tuple(conv.stride), tuple(tuple(p) for p in conv.padding),
                            tuple(conv.dilation), int(conv.groups))
  elif conv.role == "forward":
    (b, h, wd, c2), (ho, wo, n, f), (b2, kh, kw, f2) = x, w, y
    groups = int(conv.groups)
    if b2 != b or f2 != f or c2 != groups * n or f % groups:
      return None
    if groups == 1:
      c = b  # x's channels are the convolution's batch
    elif b == 1:
      c = groups  # depthwise: the channels are the groups
    else:
      return None
    stride, dilation = tuple(conv.dilation), tuple(conv.stride)
    pads = []
    for size, out, k, s_, d, (lo, _) in zip((h, wd), (ho, wo), (kh, kw), stride, dilation,
                                            conv.padding):
      span = (k - 1) * d + 1
      hi = max(0, (out - 1) * s_ + span - size - lo)
      if lo < 0 or (size + lo + hi - span) // s_ + 1 != out:
        return None
      pads.append((int(lo), int(hi)))
    found = _FilterGradient((n, h, wd, c), conv.input.dtype, (n, ho, wo, f),
                            conv.kernel.dtype, (kh, kw), stride, tuple(pads), dilation,
                            groups)
  else:
    return None
  try:
    win = reference.window(found.x, found.kernel, stride=found.stride,
                           padding=found.padding, dilation=found.dilation,
                           groups=found.groups)
  except ValueError:
    return None
  n, h, wd, c = found.x
  if found.dy[0] != n or c % found.groups or found.dy[3] % found.groups or \
      tuple(win.out_size(h, wd)) != found.dy[1:3]:
    return None
  return found


def _adam_call(facts: CallFacts) -> Call | None:
  """`conv2d_weight_grad(x, dy, param=param, mu=mu, nu=nu, count=count,
  kernel_size=..., learning_rate=learning_rate)` for Adam's update reading
  the gradient a convolution writes (`_filter_gradient`), the boundary being
  that gradient in any layout (cuDNN's OHWI, XLA's [C, KH, KW, F]). The
  state's dtype is the one the gradient is cast to for the update, else the
  gradient's own. None for an unfused epilogue of anything else."""
  if facts.kind != "unfused-epilogue" or facts.convolution is None:
    return None
  grad = _filter_gradient(facts.convolution)
  boundary = tuple(int(d) for d in facts.boundary.dims)
  if grad is None or sorted(boundary) != sorted(grad.dw):
    return None
  state = facts.boundary.dtype
  for item in facts.ops:
    base, _, arg = item.partition(":")
    if base == "cast" and arg:
      state = arg
  arrays = (("x", grad.x_dtype, grad.x, True), ("dy", grad.dy_dtype, grad.dy, True),
            ("param", state, grad.dw, False), ("mu", state, grad.dw, False),
            ("nu", state, grad.dw, False), ("count", "s32", (), False))
  options = _window_options(grad.kernel, grad.stride, grad.padding, grad.dilation,
                            grad.groups)
  options.append(("learning_rate", "learning_rate", 1e-3))
  shape = f"{state}[{','.join(map(str, grad.dw))}]"
  return Call("conv2d_weight_grad", arrays, tuple(options), f"({shape}, {shape}, {shape})")
