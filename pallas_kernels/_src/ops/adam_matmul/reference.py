"""The weight gradient and its Adam step in plain jax.numpy: the op's
specification and its XLA fallback.

    g     = x^T @ dy                                 # f32 accumulation
    t     = count + 1
    mu'   = (1 - b1) * g + b1 * mu
    nu'   = (1 - b2) * g**2 + b2 * nu
    u     = (mu' / (1 - b1**t)) / (sqrt(nu' / (1 - b2**t) + eps_root) + eps)
            + weight_decay * param
    param' = param - learning_rate * u

which is optax's `adamw` (`adam` when weight_decay is 0): `scale_by_adam`,
`add_decayed_weights`, `scale_by_learning_rate` and `apply_updates`, term by
term in optax's order, so that the two agree to the last bit or so. The
update runs in float32 and each result is cast to its input's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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


def incremented(count) -> jax.Array:
  """count + 1 in int32, held at the largest int32 (optax's `safe_increment`)."""
  count = jnp.asarray(count, jnp.int32)
  top = jnp.iinfo(jnp.int32).max
  return jnp.where(count < top, count + 1, top)


def bias_corrections(count, b1: float, b2: float) -> tuple[jax.Array, jax.Array]:
  """(1 - b1**t, 1 - b2**t) in float32 for t = count + 1, as optax forms them."""
  t = incremented(count)
  return (1 - b1 ** t).astype(_F32), (1 - b2 ** t).astype(_F32)


def update(g, param, mu, nu, c1, c2, learning_rate, *, b1: float, b2: float, eps: float,
           eps_root: float, weight_decay: float):
  """The elementwise Adam step on f32 values: (param', mu', nu') in float32.

  `c1`, `c2` are `bias_corrections(count, b1, b2)`.
  """
  g = g.astype(_F32)
  mu = (1 - b1) * g + b1 * mu.astype(_F32)
  nu = (1 - b2) * (g * g) + b2 * nu.astype(_F32)
  mu_hat = mu / c1
  nu_hat = nu / c2
  u = mu_hat / (jnp.sqrt(nu_hat + eps_root) + eps)
  p = param.astype(_F32)
  if weight_decay:
    u = u + weight_decay * p
  return p + (-learning_rate) * u, mu, nu


def adam_matmul(x, dy, param, mu, nu, count, *, learning_rate, b1: float = 0.9,
                b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                weight_decay: float = 0.0, transpose_x: bool = True, precision=None):
  """`pallas_kernels.adam_matmul` in jax.numpy (the XLA implementation):
  (param', mu', nu') in param's, mu's and nu's dtypes."""
  g = gradient(x, dy, transpose_x=transpose_x, precision=precision)
  c1, c2 = bias_corrections(count, b1, b2)
  lr = jnp.asarray(learning_rate, _F32)
  p, m, v = update(g, param, mu, nu, c1, c2, lr, b1=b1, b2=b2, eps=eps,
                   eps_root=eps_root, weight_decay=weight_decay)
  return p.astype(param.dtype), m.astype(mu.dtype), v.astype(nu.dtype)


def adam_matmul_f32(x, dy, param, mu, nu, count, *, learning_rate, b1: float = 0.9,
                    b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                    weight_decay: float = 0.0, transpose_x: bool = True):
  """Ground truth for validation: float32 operands, Precision.HIGHEST, no
  final cast."""
  x, dy, param, mu, nu = (a.astype(_F32) for a in (x, dy, param, mu, nu))
  g = gradient(x, dy, transpose_x=transpose_x, precision=jax.lax.Precision.HIGHEST)
  c1, c2 = bias_corrections(count, b1, b2)
  return update(g, param, mu, nu, c1, c2, jnp.asarray(learning_rate, _F32), b1=b1, b2=b2,
                eps=eps, eps_root=eps_root, weight_decay=weight_decay)


def user_step(x, dy, param, mu, nu, count, *, learning_rate, b1: float = 0.9,
              b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
              weight_decay: float = 0.0, transpose_x: bool = True):
  """What a training step writes, as XLA gets it (the benchmark's baseline):
  the weight gradient in the operands' dtype (a bf16 dW is then cast to f32,
  as a bf16 head's is), then the update as a separate elementwise step."""
  dims = (((0,), (0,)), ((), ())) if transpose_x else (((1,), (0,)), ((), ()))
  g = jax.lax.dot_general(x, dy, dims).astype(_F32)
  c1, c2 = bias_corrections(count, b1, b2)
  p, m, v = update(g, param, mu, nu, c1, c2, jnp.asarray(learning_rate, _F32), b1=b1,
                   b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay)
  return p.astype(param.dtype), m.astype(mu.dtype), v.astype(nu.dtype)
