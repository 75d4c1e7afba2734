"""The matmul op in plain jax.numpy: its specification and its XLA fallback.

Everything is computed in float32 (operands are dequantized to float32, the
product accumulates in float32, the epilogue runs in float32) and cast once at
the end. Layout flags only say how arrays are stored; the math is always on
the logical operands x: [..., M, K] and w: [..., K, N].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops import quantize as quant

_F32 = jnp.float32

#: Accepted `activation=` names (None means "identity").
ACTIVATIONS: tuple[str, ...] = ("identity", "relu", "gelu", "gelu_tanh", "silu",
                                "sigmoid", "tanh")

#: Floating dtypes that operands keep as they are (no dequantization needed).
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16", "float64"})
#: Quantized storage dtypes, dequantized with a scale in the prologue.
QUANTIZED_DTYPES = frozenset({"int8", "int4", "float8_e4m3fn", "float8_e5m2"})


def canonical_activation(activation: str | None) -> str:
  """The canonical activation name ("identity" for None).

  Raises:
    ValueError: for a name not in `ACTIVATIONS`.
  """
  name = "identity" if activation is None else activation
  if name not in ACTIVATIONS:
    raise ValueError(f"unknown activation {activation!r}; expected one of "
                     f"{ACTIVATIONS} or None")
  return name


_ACTIVATION_FNS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "identity": lambda v: v,
    "relu": jax.nn.relu,
    "gelu": lambda v: jax.nn.gelu(v, approximate=False),
    "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}


def activate(name: str, v: jax.Array) -> jax.Array:
  """Applies activation `name` (see `ACTIVATIONS`) with jax.nn's definitions."""
  return _ACTIVATION_FNS[canonical_activation(name)](v)


def activate_grad(name: str, v: jax.Array) -> jax.Array:
  """d act(v) / dv element-wise: JAX's derivative of `activate` (relu: 0 at
  v == 0), itself differentiable for the second-order gradients."""
  fn = _ACTIVATION_FNS[canonical_activation(name)]
  return jax.jvp(fn, (v,), (jnp.ones_like(v),))[1]


def is_quantized(dtype) -> bool:
  """Whether operands of `dtype` are quantized storage (int8/int4/fp8)."""
  return jnp.dtype(dtype).name in QUANTIZED_DTYPES


def compute_dtype(x_dtype, w_dtype) -> jnp.dtype:
  """The dtype the kernel feeds to the dot (the "dequantized compute dtype").

  Two float operands promote (bf16 with f32 gives f32); a quantized operand
  takes the other operand's float dtype; two quantized operands use bfloat16
  (int8 and fp8 values are exact in it).
  """
  xq, wq = is_quantized(x_dtype), is_quantized(w_dtype)
  if not xq and not wq:
    return jnp.promote_types(x_dtype, w_dtype)
  if xq and wq:
    return jnp.dtype(jnp.bfloat16)
  return jnp.dtype(w_dtype if xq else x_dtype)


def default_out_dtype(x_dtype, w_dtype) -> jnp.dtype:
  """x's dtype for a float x, else the compute dtype."""
  if is_quantized(x_dtype):
    return compute_dtype(x_dtype, w_dtype)
  return jnp.dtype(x_dtype)


def logical_x(x: jax.Array, transpose_x: bool) -> jax.Array:
  """x as [..., M, K] (x is stored [..., K, M] when transpose_x)."""
  return jnp.swapaxes(x, -1, -2) if transpose_x else x


def logical_w(w: jax.Array, transpose_w: bool) -> jax.Array:
  """w as [..., K, N] (w is stored [..., N, K] when transpose_w)."""
  return jnp.swapaxes(w, -1, -2) if transpose_w else w


def expand_group_scale(w_scale: jax.Array, k: int, group_size: int) -> jax.Array:
  """Per-group scales [ceil(K/G), N] repeated to one row per k: [K, N]."""
  return jnp.repeat(w_scale.astype(_F32), group_size, axis=0)[:k]


def dequantize_x(x: jax.Array, x_scale: jax.Array | None) -> jax.Array:
  """Logical x [..., M, K] to float32, times x_scale (scalar or per row [..., M])."""
  xf = x.astype(_F32)
  if x_scale is None:
    return xf
  s = jnp.asarray(x_scale, _F32)
  return xf * (s if s.ndim == 0 else s[..., None])


def dequantize_w(w: jax.Array, w_scale: jax.Array | None,
                 group_size: int | None) -> jax.Array:
  """Logical w [..., K, N] to float32, times w_scale.

  w_scale is a scalar, per output channel [N], or per group along K
  [ceil(K/G), N] with `group_size` G.
  """
  wf = w.astype(_F32)
  if w_scale is None:
    return wf
  s = jnp.asarray(w_scale, _F32)
  if group_size is not None:
    s = expand_group_scale(s, w.shape[-2], group_size)
  return wf * s


def quantize_rows(y: jax.Array, kind: str) -> tuple[jax.Array, jax.Array]:
  """Per-row (last axis) quantization of float32 y: (values, scales [..., 1])."""
  amax = jnp.max(jnp.abs(y), axis=-1, keepdims=True)
  scales = quant.scale_from_amax(amax, kind)
  return quant.quantize(y, scales, kind), scales


def reference(x: jax.Array, w: jax.Array, *, bias: jax.Array | None = None,
              activation: str | None = None, residual: jax.Array | None = None,
              out_dtype=None, scale: jax.Array | None = None,
              clamp: tuple[float | None, float | None] | None = None,
              x_scale: jax.Array | None = None, w_scale: jax.Array | None = None,
              w_group_size: int | None = None, transpose_x: bool = False,
              transpose_w: bool = False, transpose_out: bool = False,
              quantize: str | None = None,
              precision: jax.lax.Precision | None = None, w_column_sum: bool = False,
              activation_grad: str | None = None, preactivation: jax.Array | None = None):
  """`pallas_kernels.matmul` in jax.numpy (float32 math, one cast at the end).

  The exact order (x_l, w_l are the logical operands)::

    xd  = x_l.astype(f32) * x_scale[..., None]        # prologue (x_scale: () or [..., M])
    wd  = w_l.astype(f32) * w_scale                   # () / [N] / [K//G, N] repeated G times
    acc = jnp.matmul(xd, wd, precision=precision, preferred_element_type=f32)
    y   = acc * scale                                 # () or [N]
    y   = y + bias                                    # [N]
    y   = act(y)   or, with activation_grad:  y * act'(preactivation_l)
    y   = y + residual_l                              # result shape
    y   = jnp.clip(y, lo, hi)
    out = y.astype(out_dtype)  or  quantize_rows(y)   # per row of the logical result
    out = swapaxes(out, -1, -2) if transpose_out      # (both values and scales)
    colsum = jnp.sum(wd, axis=-2)                     # w_column_sum: (out, colsum)

  Args:
    x: [..., M, K] ([..., K, M] when transpose_x); float, int8 or fp8.
    w: [..., K, N] ([..., N, K] when transpose_w); float, int8, int4 or fp8.
      Batch dims of x and w broadcast like jnp.matmul.
    bias: [N], added after `scale`.
    activation: one of `ACTIVATIONS` or None.
    residual: array of the result's shape (transposed when transpose_out).
    out_dtype: result dtype; default `default_out_dtype(x, w)`.
    scale: epilogue multiplier, scalar or [N].
    clamp: (lo, hi); either may be None for no bound.
    x_scale: dequantization scale of x, scalar or per row [..., M].
    w_scale: dequantization scale of w, scalar, [N], or [ceil(K/G), N].
    w_group_size: G, when w_scale is per group along K.
    transpose_x, transpose_w: operands are stored transposed.
    transpose_out: the result is stored transposed: [..., N, M].
    quantize: None, "int8" or "float8_e4m3fn": return (values, scales), scales
      float32 per logical row, shaped to broadcast against values ([..., M, 1],
      or [..., 1, M] when transpose_out), values = quantize(y / scales).
    precision: precision of the float32 matmul (HIGHEST for validation).
    w_column_sum: also return the float32 column sums of the dequantized
      logical w, `sum(wd, axis=-2)`: [..., N] with w's own batch dims.
    activation_grad: one of `ACTIVATIONS`: the activation step multiplies by
      its derivative at `preactivation` instead (`activation` is not applied).
    preactivation: array of the result's shape (transposed when
      transpose_out), read with activation_grad.

  Returns:
    The result array, or (values, scales) when quantizing; with w_column_sum
    the pair (that result, column sums).
  """
  xl = logical_x(x, transpose_x)
  wl = logical_w(w, transpose_w)
  plain = (x_scale is None and w_scale is None and not is_quantized(x.dtype)
           and not is_quantized(w.dtype))
  if plain and jax.default_backend() != "cpu":
    # Float operands: products are exact in f32, so the promoted dtype with an
    # f32 accumulator equals the f32 product and keeps the GPU fallback on
    # tensor cores. (XLA:CPU cannot run batched bf16 x bf16 -> f32 dots.)
    cdt = compute_dtype(x.dtype, w.dtype)
    xd, wd = xl.astype(cdt), wl.astype(cdt)
  else:
    xd = dequantize_x(xl, x_scale)
    wd = dequantize_w(wl, w_scale, w_group_size)
  y = jnp.matmul(xd, wd, precision=precision, preferred_element_type=_F32)
  y = y.astype(_F32)
  out = _epilogue(y, x.dtype, w.dtype, bias=bias, activation=activation,
                  residual=residual, out_dtype=out_dtype, scale=scale, clamp=clamp,
                  transpose_out=transpose_out, quantize=quantize,
                  activation_grad=activation_grad, preactivation=preactivation)
  if not w_column_sum:
    return out
  return out, jnp.sum(dequantize_w(wl, w_scale, w_group_size), axis=-2)


def _epilogue(y, x_dtype, w_dtype, *, bias, activation, residual, out_dtype, scale, clamp,
              transpose_out, quantize, activation_grad=None, preactivation=None):
  """`reference`'s steps after the product, on the float32 accumulator y."""
  if scale is not None:
    y = y * jnp.asarray(scale, _F32)
  if bias is not None:
    y = y + bias.astype(_F32)
  if activation_grad is not None:
    z = logical_x(preactivation, transpose_out).astype(_F32)
    y = y * activate_grad(activation_grad, z)
  else:
    y = activate(canonical_activation(activation), y)
  if residual is not None:
    y = y + logical_x(residual, transpose_out).astype(_F32)
  if clamp is not None:
    lo, hi = clamp
    y = jnp.clip(y, lo, hi)
  if quantize is not None:
    values, scales = quantize_rows(y, quantize)
    if transpose_out:
      return jnp.swapaxes(values, -1, -2), jnp.swapaxes(scales, -1, -2)
    return values, scales
  dtype = default_out_dtype(x_dtype, w_dtype) if out_dtype is None else out_dtype
  out = y.astype(dtype)
  return jnp.swapaxes(out, -1, -2) if transpose_out else out


def xla_baseline(x: jax.Array, w: jax.Array, *, x_scale: jax.Array | None = None,
                 w_scale: jax.Array | None = None, w_group_size: int | None = None,
                 transpose_x: bool = False, transpose_w: bool = False, out_dtype=None,
                 precision=None, **epilogue):
  """The same call as a user writes it in jnp, for `bench` to time against.

  Quantized operands are dequantized to the compute dtype (what the kernel
  feeds its dot), one dot at default precision with an f32 accumulator, and the
  same epilogue in jnp, which XLA fuses as it can. Not the validation
  reference: that one dequantizes to f32 and multiplies at HIGHEST.
  """
  cdt = compute_dtype(x.dtype, w.dtype)
  xd = dequantize_x(logical_x(x, transpose_x), x_scale).astype(cdt)
  wd = dequantize_w(logical_w(w, transpose_w), w_scale, w_group_size).astype(cdt)
  if out_dtype is None and epilogue.get("quantize") is None:
    out_dtype = default_out_dtype(x.dtype, w.dtype)
  return reference(xd, wd, out_dtype=out_dtype, precision=precision, **epilogue)


def num_groups(k: int, group_size: int) -> int:
  """Rows of a per-group scale array: ceil(K / G)."""
  return math.ceil(k / group_size)
