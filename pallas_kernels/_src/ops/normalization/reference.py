"""Plain-jnp layer norm and RMS norm: the specification and the XLA fallback.

Semantics (the kernels must match these):

* Normalization is over the last axis; any leading dims are rows.
* Prologue: with `residual`, `h = x + residual` is added in float32 and rounded
  to `h_dtype = promote_types(x.dtype, residual.dtype)`. That rounded `h` is both
  returned (the next layer's residual stream) and normalized, so the fused op
  equals normalizing `x + residual` computed unfused.
* Statistics are float32: layer norm uses the two-pass variance
  `mean((h - mean(h))**2)` (never `E[h^2] - E[h]^2`, which cancels), RMS norm
  `mean(h**2)`; `rstd = rsqrt(var + eps)`.
* `y = (h - mean) * rstd * gamma + beta` (layer norm) or `h * rstd * gamma`
  (RMS norm), in float32, then the epilogue: cast to `out_dtype` (default
  `h_dtype`), or per-row quantization (see `ops/quantize.py`) returning
  `(values, scales)` with `scales` float32 of shape `[..., 1]`.
* Return value: `normalized` without residual, `(normalized, h)` with it, where
  `normalized` is an array or a `(values, scales)` pair.
* Non-finite inputs propagate as this XLA code propagates them: a NaN makes
  its whole row NaN; an Inf makes a layer-norm row NaN (inf - inf when
  centering) and an RMS-norm row 0 except NaN at the Inf (rstd = 0).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops import quantize as quant


def h_dtype(x_dtype, residual_dtype=None) -> jnp.dtype:
  """dtype of `h = x + residual` (and the default output dtype)."""
  if residual_dtype is None:
    return jnp.dtype(x_dtype)
  return jnp.promote_types(x_dtype, residual_dtype)


def _prologue(x, residual):
  if residual is None:
    return x
  dt = h_dtype(x.dtype, residual.dtype)
  return (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(dt)


def _epilogue(y32, out_dtype, quantize: str | None, final_cast: bool):
  if quantize is not None:
    amax = jnp.max(jnp.abs(y32), axis=-1, keepdims=True)
    scale = quant.scale_from_amax(amax, quantize)
    return quant.quantize(y32, scale, quantize), scale
  return y32.astype(out_dtype) if final_cast else y32


def _norm(kind: str, x, gamma, beta, residual, eps, out_dtype, quantize,
          final_cast: bool):
  h = _prologue(x, residual)
  h32 = h.astype(jnp.float32)
  if kind == "layer_norm":
    mean = jnp.mean(h32, axis=-1, keepdims=True)
    centered = h32 - mean
    var = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
  else:
    centered = h32
    var = jnp.mean(jnp.square(h32), axis=-1, keepdims=True)
  y32 = centered * jax.lax.rsqrt(var + jnp.float32(eps)) * gamma.astype(jnp.float32)
  if beta is not None:
    y32 = y32 + beta.astype(jnp.float32)
  out_dtype = h.dtype if out_dtype is None else jnp.dtype(out_dtype)
  normalized = _epilogue(y32, out_dtype, quantize, final_cast)
  if residual is None:
    return normalized
  return normalized, h


def layer_norm(x, gamma, beta, *, residual=None, eps: float = 1e-6,
               out_dtype=None, quantize: str | None = None) -> Any:
  """Layer norm with the semantics of the module docstring (XLA fallback)."""
  return _norm("layer_norm", x, gamma, beta, residual, eps, out_dtype, quantize,
               final_cast=True)


def rms_norm(x, gamma, *, residual=None, eps: float = 1e-6, out_dtype=None,
             quantize: str | None = None) -> Any:
  """RMS norm with the semantics of the module docstring (XLA fallback)."""
  return _norm("rms_norm", x, gamma, None, residual, eps, out_dtype, quantize,
               final_cast=True)


def layer_norm_f32(x, gamma, beta, *, residual=None, eps: float = 1e-6,
                   out_dtype=None, quantize: str | None = None) -> Any:
  """Ground truth for validation: like `layer_norm` but `normalized` stays
  float32 (no final cast); `h` keeps its specified rounding. There is no
  matmul here, so no `precision` to raise."""
  del out_dtype  # The ground truth is float32 whatever the op returns.
  return _norm("layer_norm", x, gamma, beta, residual, eps, None, quantize,
               final_cast=False)


def rms_norm_f32(x, gamma, *, residual=None, eps: float = 1e-6,
                 out_dtype=None, quantize: str | None = None) -> Any:
  """Ground truth for validation; see `layer_norm_f32`."""
  del out_dtype
  return _norm("rms_norm", x, gamma, None, residual, eps, None, quantize,
               final_cast=False)

