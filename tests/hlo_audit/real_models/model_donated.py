"""flax.linen MLP with a bf16 compute dtype (f32 params cast to bf16, as
`nn.Dense(dtype=jnp.bfloat16)` does), train state donated to the step with
donate_argnums: XLA writes the new params and optimizer state in place."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, DIM, HIDDEN = 64, 128, 512


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(HIDDEN, dtype=jnp.bfloat16)(x)  # <up>
    h = nn.relu(h)  # <relu>
    return nn.Dense(DIM, dtype=jnp.bfloat16)(h)  # <down>


model = MLP()
tx = optax.adamw(1e-3)


@functools.partial(jax.jit, donate_argnums=(0, 1))  # <donate>
def train_step(params, opt_state, x, y):
  def loss_fn(params):
    pred = model.apply({"params": params}, x)  # <apply>
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)
  loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss  # <apply_updates>


def build():
  x = jnp.zeros((BATCH, DIM), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  return train_step, (params, tx.init(params), x, jnp.zeros((BATCH, DIM)))
