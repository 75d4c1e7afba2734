"""Training-mode batch norm over channels-last x in plain jax.numpy: the
specification, the XLA fallback and (differentiated by JAX) the backward
the kernels must match.

    mean = mean(x, every axis but the last)            # f32 [C]
    var  = mean((x - mean)**2, same axes)              # f32 [C], biased
    y    = act((x - mean) * rsqrt(var + eps) * gamma + beta)   # f32, then x.dtype

Biased variance, as keras' BatchNormalization and flax's nn.BatchNorm
normalize with (each updates its running statistics from it). The variance
is two-pass here (the kernel shifts instead, see `kernel.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops.conv2d import reference as conv2d_reference

_F32 = jnp.float32

#: Accepted `activation=` names (None: "identity"): the convolution's.
ACTIVATIONS = conv2d_reference.ACTIVATIONS
canonical_activation = conv2d_reference.canonical_activation


def reduced_axes(ndim: int) -> tuple[int, ...]:
  """Every axis but the last: the axes the statistics reduce."""
  return tuple(range(ndim - 1))


def _batch_norm(x, gamma, beta, *, eps: float, activation: str | None):
  axes = reduced_axes(x.ndim)
  x32 = x.astype(_F32)
  mean = jnp.mean(x32, axis=axes)
  var = jnp.mean(jnp.square(x32 - mean), axis=axes)
  pre = ((x32 - mean) * jax.lax.rsqrt(var + jnp.float32(eps)) * gamma.astype(_F32)
         + beta.astype(_F32))
  return conv2d_reference.activate(activation, pre), mean, var


def batch_norm(x, gamma, beta, *, eps: float = 1e-3, activation: str | None = None):
  """(y in x.dtype, mean f32 [C], var f32 [C]) as the module docstring says."""
  y, mean, var = _batch_norm(x, gamma, beta, eps=eps, activation=activation)
  return y.astype(x.dtype), mean, var


def batch_norm_f32(x, gamma, beta, *, eps: float = 1e-3, activation: str | None = None):
  """The ground truth for validation: `batch_norm` with y left in float32.
  No matmul here, so no precision to raise."""
  return _batch_norm(x, gamma, beta, eps=eps, activation=activation)
