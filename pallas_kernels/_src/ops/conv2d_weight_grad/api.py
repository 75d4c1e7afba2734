"""`pallas_kernels.conv2d_weight_grad`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.conv2d_weight_grad import config as config_lib
from pallas_kernels._src.ops.conv2d_weight_grad import guard
from pallas_kernels._src.ops.conv2d_weight_grad import kernel
from pallas_kernels._src.ops.conv2d_weight_grad import reference
from pallas_kernels._src.ops.conv2d_weight_grad.config import Config
from pallas_kernels._src.ops.conv2d_weight_grad.reference import Window

IMPLEMENTATIONS = ("pallas", "xla")


def _fail(message: str) -> None:
  raise ValueError(f"conv2d_weight_grad: {message}")


def _shape(a) -> list[int]:
  return [int(d) for d in a.shape]


def _check(x, dy, kernel_size, stride, padding, dilation, groups, column_sum,
           implementation, config) -> Window:
  for name, a in (("x", x), ("dy", dy)):
    if not jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating) and \
        not jnp.issubdtype(jnp.dtype(a.dtype), jnp.integer):
      _fail(f"{name} must be a real floating or integer array, got "
            f"{jnp.dtype(a.dtype).name}{_shape(a)}")
    if a.ndim != 4:
      _fail(f"{name} must be NHWC, 4 axes, got shape {_shape(a)}")
  try:
    win = reference.window(x.shape, kernel_size, stride=stride, padding=padding,
                           dilation=dilation, groups=groups)
  except ValueError as e:
    _fail(str(e))
  c, f = x.shape[-1], dy.shape[-1]
  if c % groups or f % groups:
    _fail(f"groups={groups} must divide x's channels C={c} and dy's F={f}")
  want = (x.shape[0], *win.out_size(x.shape[1], x.shape[2]))
  if tuple(dy.shape[:3]) != want:
    _fail(f"dy{_shape(dy)} does not match the convolution's output [N, HO, WO]="
          f"{list(want)} for x{_shape(x)}, kernel {win.kernel}, stride {win.stride}, "
          f"dilation {win.dilation}, padding {win.padding}")
  if not isinstance(column_sum, bool):
    _fail(f"column_sum must be a bool, got {column_sum!r}")
  if implementation not in (None,) + IMPLEMENTATIONS:
    _fail(f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    _fail(f"config must be a conv2d_weight_grad Config, got {type(config).__name__}")
  return win


@functools.partial(jax.jit, static_argnames=("win", "column_sum", "out_dtype"))
def _reference(x, dy, *, win: Window, column_sum: bool, out_dtype: str):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.conv2d_weight_grad(x, dy, win, column_sum_=column_sum,
                                      out_dtype=out_dtype)


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable)."""

  win: Window
  column_sum: bool
  out_dtype: str
  config: Config
  interpret: bool
  #: The device traced for (part of the trace cache's key).
  target: backend_lib.Target


@functools.partial(jax.jit, static_argnums=(2,))
def _run(x, dy, static: Static):
  out = kernel.weight_grad(x, dy, static.win, column_sum=static.column_sum,
                           cfg=static.config, interpret=static.interpret)
  if static.column_sum:
    dw, db = out
    return dw.astype(static.out_dtype), db
  return out.astype(static.out_dtype)


def conv2d_weight_grad(x: jax.Array, dy: jax.Array, kernel_size: int | tuple[int, int], *,
                       stride: int | tuple[int, int] = 1,
                       padding: str | tuple[tuple[int, int], tuple[int, int]] = "SAME",
                       dilation: int | tuple[int, int] = 1, groups: int = 1,
                       column_sum: bool = False, out_dtype: Any = None,
                       implementation: str | None = None, interpret: bool | None = None,
                       config: Config | None = None):
  """The weight gradient of a 2-D convolution, and optionally dy's column sum.

  For y = lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation,
  feature_group_count=groups, dimension_numbers=("NHWC", "HWIO", "NHWC")),
  returns dL/dw [KH, KW, C // groups, F] given x [N, H, W, C] and dy = dL/dy
  [N, HO, WO, F]: per tap (kh, kw), x_tap^T @ dy over the N*HO*WO output
  pixels, x_tap gathered tile by tile in the kernel (no im2col buffer).
  With `column_sum=True` the kernel also sums the dy tiles it loads, so the
  bias (or batch/group-norm beta) gradient sum(dy, axis=(0, 1, 2)) costs no
  second read of dy. The jnp equivalent (`reference.conv2d_weight_grad`)::

    _, pullback = jax.vjp(lambda w: conv(x, w), w0)
    dw = pullback(dy)[0].astype(out_dtype)
    db = jnp.sum(dy.astype(f32), axis=(0, 1, 2))

  Depthwise (groups == C) and grouped convolutions are supported; the
  depthwise kernel multiply-accumulates per channel instead of a dot.

  Not differentiable: it is itself a gradient, and no second derivative is
  defined for it (differentiate the forward convolution twice instead).

  Args:
    x: [N, H, W, C], float32/bfloat16/float16.
    dy: [N, HO, WO, F], x's dtype; HO, WO must be the convolution's.
    kernel_size: (KH, KW), or one int for both.
    stride: an int or an (h, w) pair.
    padding: "SAME", "VALID" or ((top, bottom), (left, right)), as lax's.
    dilation: the kernel's (rhs) dilation, an int or an (h, w) pair.
    groups: feature groups (lax's feature_group_count); C and F divisible by it.
    column_sum: also return sum(dy, axis=(0, 1, 2)) in float32 [F].
    out_dtype: dtype of dw (default x.dtype); accumulation is float32.
    implementation: "pallas" (the kernel; interpreted where nothing compiles
      it), "xla" (the reference), or None: the kernel where it compiles (GPU)
      or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling; None picks `config.heuristic_config`. float32 operands
      multiply in IEEE float32 (Precision.HIGHEST).

  Returns:
    dw [KH, KW, C // groups, F] in out_dtype; with column_sum, (dw, db).

  Raises:
    ValueError: for invalid calls (non-NHWC arrays, a dy that is not the
      convolution's output shape, groups not dividing C and F, a malformed
      window or an unknown implementation). A call the kernel cannot run
      (dtypes, backend, size limits) is not an error: it runs the XLA
      reference and is recorded in `pallas_kernels.fallbacks()`.
  """
  x, dy = jnp.asarray(x), jnp.asarray(dy)
  win = _check(x, dy, kernel_size, stride, padding, dilation, groups, column_sum,
               implementation, config)
  odt = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
  operands = (x, dy)

  def run_reference():
    return _reference(x, dy, win=win, column_sum=column_sum, out_dtype=odt.name)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    n, ho, wo, f = dy.shape
    cg = x.shape[-1] // win.groups
    cfg = config or config_lib.choose_config(n * ho * wo, cg, f // win.groups, win.taps,
                                             win.groups, x.dtype, interp)
    reason = guard.unsupported_reason(x, dy, win, out_dtype=odt, interpret=interp,
                                      config=cfg)
    if reason:
      guard_lib.record_fallback("conv2d_weight_grad", reason,
                                guard_lib.signature(x=x, dy=dy))
      return run_reference()
    static = Static(win=win, column_sum=column_sum, out_dtype=odt.name, config=cfg,
                    interpret=interp, target=backend_lib.target())
    return _run(x, dy, static)

  return backend_lib.dispatch(interpret, operands, launch)
