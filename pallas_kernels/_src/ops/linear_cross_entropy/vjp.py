"""custom_vjp wiring of the linear_cross_entropy kernels.

The differentiated function is the per-token loss [T] (float32); reductions
are plain jnp on top of it, so JAX turns the cotangent of a sum or mean into
the per-token g the backward kernels take. The forward saves x, w, bias,
labels and the per-token lse [T]: the backward recomputes the logits tile by
tile and never holds [T, V] either; its float32 sums of dx [T, D], dw [D, V]
and dbias [V] are cast to the operands' dtypes here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src.ops.linear_cross_entropy import kernel


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def token_losses(x, w, bias, labels, p: kernel.Dims):
  """Per-token losses [T] of x [T, D], w [D, V], bias [V] or None, labels [T]."""
  loss, _ = kernel.forward(x, w, bias, labels, p=p)
  return loss


def _fwd(x, w, bias, labels, p: kernel.Dims):
  loss, lse = kernel.forward(x, w, bias, labels, p=p)
  return loss, (x, w, bias, labels, lse)


def _bwd(p: kernel.Dims, saved, g):
  x, w, bias, labels, lse = saved
  g = g.astype(jnp.float32)
  dx, dw, dbias = kernel.backward(x, w, bias, labels, lse, g, p=p)
  dbias = None if bias is None else dbias.astype(bias.dtype)
  return dx.astype(x.dtype), dw.astype(w.dtype), dbias, np.zeros(labels.shape, dtype=jax.dtypes.float0)


token_losses.defvjp(_fwd, _bwd)
