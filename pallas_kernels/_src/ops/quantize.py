"""Per-row symmetric quantization: the one definition shared by kernels and references.

A row `y` becomes `values = q(y / scale)` and `scale = amax(|y|) / QMAX[kind]`
(float32), so that `values.astype(f32) * scale` approximates `y`. A row of zeros
gets scale 1 (not 0) so that dequantization never divides by zero. int8 rounds
half away from zero (Triton has no round-half-even), and clips to +-127 so the
range stays symmetric. float8_e4m3fn converts with round-to-nearest after
scaling, clipped to +-448 (its largest finite value).

The functions use only `jnp` element-wise ops, so the same code runs inside a
Pallas kernel body and in the plain-XLA reference.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

#: Largest representable magnitude used by each quantized format.
QMAX: dict[str, float] = {"int8": 127.0, "float8_e4m3fn": 448.0}

#: Accepted values of the ops' `quantize=` argument.
KINDS: tuple[str, ...] = tuple(QMAX)


def dtype_of(kind: str) -> jnp.dtype:
  """The storage dtype of quantized values of `kind`."""
  return jnp.dtype(kind)


def scale_from_amax(amax, kind: str):
  """Per-row float32 scale from the row's max |y| (1 for all-zero rows)."""
  amax = amax.astype(jnp.float32)
  return jnp.where(amax > 0, amax / QMAX[kind], jnp.ones_like(amax))


def quantize(y, scale, kind: str, *, native_round: bool = False):
  """Quantizes float32 `y` with a broadcastable float32 `scale`.

  Args:
    y, scale: float32 values and their (broadcastable) scales.
    kind: "int8" or "float8_e4m3fn".
    native_round: round half away from zero with `lax.round` (Mosaic GPU
      lowers it, not floor) instead of sign * floor(|v| + 0.5) (Triton lowers
      floor, not round); the two give the same values.
  """
  v = y / scale
  qmax = QMAX[kind]
  v = jnp.minimum(jnp.maximum(v, -qmax), qmax)
  if kind == "int8":
    if native_round:
      v = lax.round(v, lax.RoundingMethod.AWAY_FROM_ZERO)
    else:
      v = jnp.sign(v) * jnp.floor(jnp.abs(v) + 0.5)
  return v.astype(dtype_of(kind))
