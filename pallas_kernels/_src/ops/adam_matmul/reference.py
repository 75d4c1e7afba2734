"""The weight gradient and its Adam step in plain jax.numpy: the op's
specification and its XLA fallback.

    g     = x^T @ dy                                 # f32 accumulation
    t     = count + 1
    mu'   = (1 - b1) * g + b1 * mu
    nu'   = (1 - b2) * g**2 + b2 * nu
    u     = (mu' / (1 - b1**t)) / (sqrt(nu' / (1 - b2**t) + eps_root) + eps)
            + weight_decay * param
    param' = param - learning_rate * u

which is optax's `adamw` (`adam` when weight_decay is 0), term by term in
optax's order (`adam_reference.py`, which the convolution's weight gradient
shares). The update runs in float32 and each result is cast to its input's
dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops import adam_reference

_F32 = jnp.float32


def gradient(x, dy, *, transpose_x: bool = True, precision=None) -> jax.Array:
  """g = x^T @ dy ([M, K], [M, N] -> [K, N]; x @ dy for x [K, M] when
  transpose_x is False), accumulated in float32."""
  if jax.default_backend() == "cpu":
    # XLA:CPU cannot run some bf16 x bf16 -> f32 dots; 16-bit products are
    # exact in f32, so widening first changes only the summation order.
    x, dy = x.astype(_F32), dy.astype(_F32)
  dims = (((0,), (0,)), ((), ())) if transpose_x else (((1,), (0,)), ((), ()))
  return jax.lax.dot_general(x, dy, dims, precision=precision,
                             preferred_element_type=_F32).astype(_F32)


def adam_matmul(x, dy, param, mu, nu, count, *, learning_rate, b1: float = 0.9,
                b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                weight_decay: float = 0.0, transpose_x: bool = True, precision=None):
  """`pallas_kernels.adam_matmul` in jax.numpy (the XLA implementation):
  (param', mu', nu') in param's, mu's and nu's dtypes."""
  g = gradient(x, dy, transpose_x=transpose_x, precision=precision)
  new = adam_reference.step(g, param, mu, nu, count, learning_rate=learning_rate, b1=b1,
                            b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay)
  return adam_reference.cast_like(new, (param, mu, nu))


def adam_matmul_f32(x, dy, param, mu, nu, count, *, learning_rate, b1: float = 0.9,
                    b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                    weight_decay: float = 0.0, transpose_x: bool = True):
  """Ground truth for validation: float32 operands, Precision.HIGHEST, no
  final cast."""
  x, dy, param, mu, nu = (a.astype(_F32) for a in (x, dy, param, mu, nu))
  g = gradient(x, dy, transpose_x=transpose_x, precision=jax.lax.Precision.HIGHEST)
  return adam_reference.step(g, param, mu, nu, count, learning_rate=learning_rate, b1=b1,
                             b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay)


def user_step(x, dy, param, mu, nu, count, *, learning_rate, b1: float = 0.9,
              b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
              weight_decay: float = 0.0, transpose_x: bool = True):
  """What a training step writes, as XLA gets it (the benchmark's baseline):
  the weight gradient in the operands' dtype (a bf16 dW is then cast to f32,
  as a bf16 head's is), then the update as a separate elementwise step."""
  dims = (((0,), (0,)), ((), ())) if transpose_x else (((1,), (0,)), ((), ()))
  g = jax.lax.dot_general(x, dy, dims).astype(_F32)
  new = adam_reference.step(g, param, mu, nu, count, learning_rate=learning_rate, b1=b1,
                            b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay)
  return adam_reference.cast_like(new, (param, mu, nu))
