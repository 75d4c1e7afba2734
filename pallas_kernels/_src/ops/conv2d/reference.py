"""The fused 2-D convolution in plain jax.numpy: its specification and its
XLA fallback (and, differentiated by JAX, the op's backward).

    v = act_in(x * scale + shift)           # f32, then rounded to x.dtype
    v = pad(v, zeros)                       # the padding AFTER the prologue
    acc = conv(v, w)                        # f32 accumulation, NHWC/HWIO
    z = act(acc + bias) + residual          # f32
    y = z.astype(out_dtype);  stats = (sum(z), sum(z * z)) over N, HO, WO

This is what a batch-normed CNN writes (keras' BatchNormalization, an
activation, ZeroPadding2D, then a VALID Conv2D): XLA writes `v` to memory
(padded) and the convolution reads it back; the epilogue and the statistics
read the convolution's output again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops.matmul import reference as matmul_reference

_F32 = jnp.float32
DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")

#: Accepted activation names (None: "identity"): the matmul's, and the hard
#: variants MobileNetV3 uses (relu6(x + 3) / 6 gates).
ACTIVATIONS: tuple[str, ...] = matmul_reference.ACTIVATIONS + (
    "relu6", "hard_sigmoid", "hard_swish")

_EXTRA: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu6": jax.nn.relu6,
    "hard_sigmoid": jax.nn.hard_sigmoid,
    "hard_swish": jax.nn.hard_swish,
}


def canonical_activation(activation: str | None) -> str:
  """The activation's name ("identity" for None).

  Raises:
    ValueError: for a name not in `ACTIVATIONS`.
  """
  name = "identity" if activation is None else activation
  if name not in ACTIVATIONS:
    raise ValueError(f"unknown activation {activation!r}; expected one of "
                     f"{ACTIVATIONS} or None")
  return name


def activate(name: str | None, v: jax.Array) -> jax.Array:
  """Activation `name` with jax.nn's definitions."""
  name = canonical_activation(name)
  if name in _EXTRA:
    return _EXTRA[name](v)
  return matmul_reference.activate(name, v)


def pair(v: int | Sequence[int], what: str) -> tuple[int, int]:
  """(vertical, horizontal) of an int or a pair of positive ints.

  Raises:
    ValueError: for anything else.
  """
  vals = (v, v) if isinstance(v, int) else tuple(v)
  if len(vals) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                               for d in vals):
    raise ValueError(f"{what} must be a positive int or a pair of them, got {v!r}")
  return int(vals[0]), int(vals[1])


def resolve_padding(padding, in_hw: tuple[int, int], kernel_hw: tuple[int, int],
                    stride: tuple[int, int], dilation: tuple[int, int]
                    ) -> tuple[tuple[int, int], tuple[int, int]]:
  """((top, bottom), (left, right)) of "SAME", "VALID" or explicit pairs,
  as `lax.conv_general_dilated` resolves them (the dilated window's extent).

  Raises:
    ValueError: for anything else.
  """
  if isinstance(padding, str):
    if padding.upper() not in ("SAME", "VALID"):
      raise ValueError(f"padding must be 'SAME', 'VALID' or ((lo, hi), (lo, hi)), "
                       f"got {padding!r}")
    window = tuple((k - 1) * d + 1 for k, d in zip(kernel_hw, dilation))
    pads = jax.lax.padtype_to_pads(in_hw, window, stride, padding.upper())
    return (int(pads[0][0]), int(pads[0][1])), (int(pads[1][0]), int(pads[1][1]))
  try:
    (t, b), (l, r) = padding
    out = ((int(t), int(b)), (int(l), int(r)))
  except (TypeError, ValueError):
    raise ValueError(f"padding must be 'SAME', 'VALID' or ((lo, hi), (lo, hi)), "
                     f"got {padding!r}") from None
  if any(not isinstance(v, int) or isinstance(v, bool) for p in padding for v in p):
    raise ValueError(f"explicit padding must hold ints, got {padding!r}")
  return out


def output_hw(in_hw, kernel_hw, stride, dilation, pads) -> tuple[int, int]:
  """(HO, WO): the window positions that fit in the padded input."""
  return tuple(  # type: ignore[return-value]
      (n + lo + hi - ((k - 1) * d + 1)) // s + 1
      for n, k, s, d, (lo, hi) in zip(in_hw, kernel_hw, stride, dilation, pads))


def _widen(*arrays):
  # XLA:CPU cannot run some 16-bit convolutions into f32; 16-bit products are
  # exact in f32, so widening first changes only the summation order.
  if jax.default_backend() == "cpu":
    return tuple(None if a is None else a.astype(_F32) for a in arrays)
  return arrays


def _forward(x, w, *, stride, padding, dilation, groups, scale, shift, prologue_activation,
             bias, activation, residual, precision, prologue_dtype):
  stride, dilation = pair(stride, "stride"), pair(dilation, "dilation")
  pads = resolve_padding(padding, x.shape[1:3], w.shape[:2], stride, dilation)
  v = x
  prologue = (scale is not None or shift is not None
              or canonical_activation(prologue_activation) != "identity")
  if prologue:
    v = v.astype(_F32)
    if scale is not None:
      v = v * scale.astype(_F32)
    if shift is not None:
      v = v + shift.astype(_F32)
    v = activate(prologue_activation, v)
    # Rounded as the array XLA writes between the two kernels.
    v = v.astype(prologue_dtype).astype(x.dtype)
  # The padding comes after the prologue: padded positions are zeros.
  v = jax.lax.pad(v, jnp.zeros((), v.dtype), ((0, 0, 0), pads[0] + (0,), pads[1] + (0,),
                                              (0, 0, 0)))
  v, w = _widen(v, w)
  acc = jax.lax.conv_general_dilated(
      v, w, window_strides=stride, padding="VALID", rhs_dilation=dilation,
      dimension_numbers=DIMENSION_NUMBERS, feature_group_count=groups,
      precision=precision, preferred_element_type=_F32).astype(_F32)
  if bias is not None:
    acc = acc + bias.astype(_F32)
  z = activate(activation, acc)
  if residual is not None:
    z = z + residual.astype(_F32)
  return z


def _statistics(z):
  return jnp.sum(z, axis=(0, 1, 2)), jnp.sum(z * z, axis=(0, 1, 2))


def conv2d(x, w, *, stride=1, padding="SAME", dilation=1, groups: int = 1, scale=None,
           shift=None, prologue_activation=None, bias=None, activation=None, residual=None,
           out_dtype=None, statistics: bool = False, precision=None):
  """`pallas_kernels.conv2d` in jax.numpy (the XLA implementation).

  Args: as `pallas_kernels.conv2d`; `precision` of the convolution.

  Returns:
    y [N, HO, WO, F] in out_dtype (default x.dtype), and with
    `statistics=True` also (sum, sum of squares), f32 [F] each, of y before
    the cast.
  """
  z = _forward(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups,
               scale=scale, shift=shift, prologue_activation=prologue_activation,
               bias=bias, activation=activation, residual=residual, precision=precision,
               prologue_dtype=x.dtype)
  y = z.astype(x.dtype if out_dtype is None else out_dtype)
  return (y, _statistics(z)) if statistics else y


def conv2d_f32(x, w, *, stride=1, padding="SAME", dilation=1, groups: int = 1, scale=None,
               shift=None, prologue_activation=None, bias=None, activation=None,
               residual=None, out_dtype=None, statistics: bool = False):
  """Ground truth for validation: float32 operands, Precision.HIGHEST, no
  final cast. The prologue's result is rounded to x's dtype, as the op
  defines it (the convolution's operand is x's dtype: the array a 16-bit
  model writes, and what a 16-bit kernel's dot reads); everything else is
  float32, so an f32 output (statistics, out_dtype=f32) is held to f32."""
  del out_dtype
  f32 = lambda a: None if a is None else a.astype(_F32)  # noqa: E731
  z = _forward(f32(x), f32(w), stride=stride, padding=padding, dilation=dilation,
               groups=groups, scale=f32(scale), shift=f32(shift),
               prologue_activation=prologue_activation, bias=f32(bias),
               activation=activation, residual=f32(residual),
               precision=jax.lax.Precision.HIGHEST, prologue_dtype=x.dtype)
  return (z, _statistics(z)) if statistics else z
