"""Adam's step in plain jax.numpy: what the references of the ops that apply
it (`adam_matmul`, `conv2d_weight_grad` given the optimizer state) compute
after their gradient g.

    t     = count + 1
    mu'   = (1 - b1) * g + b1 * mu
    nu'   = (1 - b2) * g**2 + b2 * nu
    u     = (mu' / (1 - b1**t)) / (sqrt(nu' / (1 - b2**t) + eps_root) + eps)
            + weight_decay * param
    param' = param - learning_rate * u

which is optax's `adamw` (`adam` when weight_decay is 0): `scale_by_adam`,
`add_decayed_weights`, `scale_by_learning_rate` and `apply_updates`, term by
term in optax's order, so that the two agree to the last bit or so. Written
apart from the kernels' `adam.tile_update`, so that each holds the other.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


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


def step(g, param, mu, nu, count, *, learning_rate, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, eps_root: float = 0.0, weight_decay: float = 0.0):
  """`update` at optax's count, the learning rate taken as f32 (the defaults
  are optax's): (param', mu', nu') in float32."""
  c1, c2 = bias_corrections(count, b1, b2)
  return update(g, param, mu, nu, c1, c2, jnp.asarray(learning_rate, _F32), b1=b1, b2=b2,
                eps=eps, eps_root=eps_root, weight_decay=weight_decay)


def cast_like(new, state):
  """(param', mu', nu') each in its input's dtype."""
  return tuple(n.astype(s.dtype) for n, s in zip(new, state))
