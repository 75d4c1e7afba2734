"""The 2-D convolution's weight gradient in plain JAX: its specification and
its XLA fallback.

For y = lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation,
feature_group_count=groups, dimension_numbers=("NHWC", "HWIO", "NHWC")):

    dw = vjp of that conv with respect to w, at dy     # [KH, KW, C // groups, F]
    db = sum(dy, axis=(0, 1, 2)) in float32            # column_sum=True

and, given the optimizer state, Adam's step on dw (optax's `adamw`, `adam`
when weight_decay is 0; `adam_reference.py`) instead of dw itself:

    param', mu', nu' = adam_reference.step(dw in float32, param, mu, nu, count, ...)

`Window` is the one normalisation of the convolution's geometry (stride,
dilation and padding as pairs, the padding explicit) that the reference, the
kernel and the guard share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops import adam_reference

_F32 = jnp.float32
_DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


def _pair(name: str, value: Any) -> tuple[int, int]:
  if isinstance(value, int) and not isinstance(value, bool):
    value = (value, value)
  if (not isinstance(value, Sequence) or len(value) != 2
      or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
    raise ValueError(f"{name} must be a positive int or a pair of them, got {value!r}")
  return int(value[0]), int(value[1])


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
  """A convolution's geometry, normalised: everything but the arrays."""

  kernel: tuple[int, int]
  stride: tuple[int, int]
  dilation: tuple[int, int]
  #: ((top, bottom), (left, right)), zeros added around x.
  padding: tuple[tuple[int, int], tuple[int, int]]
  groups: int

  @property
  def taps(self) -> int:
    return self.kernel[0] * self.kernel[1]

  def out_size(self, h: int, w: int) -> tuple[int, int]:
    """(HO, WO) of the forward convolution on an [.., h, w, ..] input."""
    out = []
    for size, k, s, d, (lo, hi) in zip((h, w), self.kernel, self.stride, self.dilation,
                                       self.padding):
      span = (k - 1) * d + 1
      out.append(max(0, (size + lo + hi - span) // s + 1))
    return out[0], out[1]


def window(x_shape: Sequence[int], kernel_size: Any, *, stride: Any = 1,
           padding: Any = "SAME", dilation: Any = 1, groups: int = 1) -> Window:
  """The `Window` of a call on NHWC `x_shape`.

  Raises:
    ValueError: for a malformed kernel size, stride, dilation, padding or groups.
  """
  kernel = _pair("kernel_size", kernel_size)
  stride = _pair("stride", stride)
  dilation = _pair("dilation", dilation)
  if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
    raise ValueError(f"groups must be a positive int, got {groups!r}")
  if isinstance(padding, str):
    if padding.upper() not in ("SAME", "VALID"):
      raise ValueError(f"padding must be 'SAME', 'VALID' or ((lo, hi), (lo, hi)), "
                       f"got {padding!r}")
    span = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilation))
    # lax's own rule, so the kernel pads exactly as the convolution does.
    pads = jax.lax.padtype_to_pads(tuple(x_shape[1:3]), span, stride, padding.upper())
  else:
    try:
      pads = tuple((lo, hi) for lo, hi in padding)
      ok = len(pads) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                  for p in pads for v in p)
    except (TypeError, ValueError):
      ok = False
    if not ok:
      raise ValueError(f"padding must be 'SAME', 'VALID' or ((lo, hi), (lo, hi)), "
                       f"got {padding!r}")
  (t, b), (l, r) = ((int(lo), int(hi)) for lo, hi in pads)
  return Window(kernel, stride, dilation, ((t, b), (l, r)), groups)


def _conv(x, w, win: Window, precision):
  return jax.lax.conv_general_dilated(
      x, w, window_strides=win.stride, padding=win.padding, rhs_dilation=win.dilation,
      feature_group_count=win.groups, dimension_numbers=_DIMENSION_NUMBERS,
      precision=precision)


def weight_grad(x, dy, win: Window, *, precision=None) -> jax.Array:
  """dL/dw of the convolution at cotangent dy, in x's dtype (XLA's own rule:
  jax.vjp of the forward convolution)."""
  c, f = x.shape[-1], dy.shape[-1]
  w0 = jnp.zeros(win.kernel + (c // win.groups, f), x.dtype)
  _, pullback = jax.vjp(lambda w: _conv(x, w, win, precision), w0)
  (dw,) = pullback(dy.astype(x.dtype))
  return dw


def column_sum(dy) -> jax.Array:
  """sum(dy, axis=(0, 1, 2)) accumulated in float32: the bias gradient."""
  return jnp.sum(dy.astype(_F32), axis=(0, 1, 2))


def conv2d_weight_grad(x, dy, win: Window, *, column_sum_: bool = False, out_dtype=None,
                       precision=None):
  """`pallas_kernels.conv2d_weight_grad` in plain JAX (the XLA implementation).

  Returns dw in out_dtype (default x's), or (dw, db) with db float32 [F].
  """
  if jax.default_backend() == "cpu" and jnp.dtype(x.dtype) != _F32:
    # XLA:CPU cannot run some bf16 convolutions with f32 results; 16-bit
    # products are exact in f32, so widening changes only the summation order.
    dw = weight_grad(x.astype(_F32), dy.astype(_F32), win, precision=precision)
  else:
    dw = weight_grad(x, dy, win, precision=precision)
  dw = dw.astype(x.dtype if out_dtype is None else out_dtype)
  return (dw, column_sum(dy)) if column_sum_ else dw


def conv2d_weight_grad_f32(x, dy, win: Window, *, column_sum_: bool = False):
  """Ground truth for validation: float32 operands, Precision.HIGHEST, no final cast."""
  dw = weight_grad(x.astype(_F32), dy.astype(_F32), win,
                   precision=jax.lax.Precision.HIGHEST)
  return (dw, column_sum(dy)) if column_sum_ else dw


def adam_step(x, dy, win: Window, param, mu, nu, count, *, learning_rate, b1: float = 0.9,
              b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
              weight_decay: float = 0.0, column_sum_: bool = False, precision=None):
  """`pallas_kernels.conv2d_weight_grad` given the optimizer state, in plain
  JAX (the XLA implementation): the filter gradient as
  `conv2d_weight_grad` computes it, in float32, then Adam's step.

  Returns (param', mu', nu') in their dtypes, then db float32 [F] with
  column_sum_.
  """
  g = conv2d_weight_grad(x, dy, win, out_dtype=_F32, precision=precision)
  new = adam_reference.step(g, param, mu, nu, count, learning_rate=learning_rate, b1=b1,
                            b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay)
  new = adam_reference.cast_like(new, (param, mu, nu))
  return new + (column_sum(dy),) if column_sum_ else new


def adam_step_f32(x, dy, win: Window, param, mu, nu, count, *, learning_rate,
                  b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                  eps_root: float = 0.0, weight_decay: float = 0.0,
                  column_sum_: bool = False):
  """Ground truth for validation: the float32 gradient at Precision.HIGHEST,
  Adam's step on float32 state, no final cast."""
  g = conv2d_weight_grad_f32(x, dy, win)
  state = (a.astype(_F32) for a in (param, mu, nu))
  new = adam_reference.step(g, *state, count, learning_rate=learning_rate, b1=b1, b2=b2,
                            eps=eps, eps_root=eps_root, weight_decay=weight_decay)
  return new + (column_sum(dy),) if column_sum_ else new
