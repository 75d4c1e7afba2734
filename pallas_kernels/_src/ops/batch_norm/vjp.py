"""custom_vjp wiring of the batch-norm kernels.

The forward saves x, gamma, beta and the f32 [C] mean and rstd; nothing of
x's size besides x itself. The backward is two passes over x and the
cotangent g of y: the first sums dbeta = sum(dy) and dgamma = sum(dy * x_hat)
with dy = g * act'(pre) recomputed, the second writes

    dx = gamma * rstd * (dy - dbeta / M - x_hat * dgamma / M)
         + ct_mean / M + ct_var * 2 * (x - mean) / M

as a * dy + b * x_hat + c, the per-channel a, b, c formed here from the sums
and the cotangents of the returned mean and var (x - mean = x_hat / rstd;
the variance's gradient has no term through the mean, as sum(x - mean) = 0).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.batch_norm import kernel
from pallas_kernels._src.ops.batch_norm.config import Config

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable)."""

  eps: float
  #: Canonical activation name ("identity" for none).
  activation: str
  cfg: Config
  interpret: bool
  #: The device traced for (part of the trace cache's key).
  target: backend_lib.Target


def _forward(x2, gamma, beta, static: Static):
  mean, var = kernel.statistics(x2, cfg=static.cfg, interpret=static.interpret)
  rstd = jax.lax.rsqrt(var + jnp.float32(static.eps))
  y = kernel.normalize(x2, mean, rstd, gamma, beta, activation=static.activation,
                       cfg=static.cfg, interpret=static.interpret)
  return (y, mean, var), rstd


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def batch_norm(x2, gamma, beta, static: Static):
  """(y, mean, var) of [M, C] x2 through the Pallas kernels."""
  return _forward(x2, gamma, beta, static)[0]


def _fwd(x2, gamma, beta, static: Static):
  out, rstd = _forward(x2, gamma, beta, static)
  return out, (x2, gamma, beta, out[1], rstd)


def _bwd(static: Static, saved, cts):
  x2, gamma, beta, mean, rstd = saved
  ct_y, ct_mean, ct_var = cts
  options = dict(activation=static.activation, cfg=static.cfg, interpret=static.interpret)
  dbeta, dgamma = kernel.backward_sums(x2, ct_y, mean, rstd, gamma, beta, **options)
  m = x2.shape[0]
  scale = gamma.astype(_F32) * rstd
  a = scale
  b = -scale * dgamma / m + 2.0 * ct_var / (m * rstd)
  c = -scale * dbeta / m + ct_mean / m
  dx = kernel.backward_dx(x2, ct_y, mean, rstd, gamma, beta, a, b, c,
                          dx_dtype=x2.dtype, **options)
  return dx, dgamma.astype(gamma.dtype), dbeta.astype(beta.dtype)


batch_norm.defvjp(_fwd, _bwd)
