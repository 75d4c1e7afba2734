"""flax.linen MLP with a bf16 compute dtype (`nn.Dense(dtype=jnp.bfloat16)`
casts the f32 params and inputs to bf16; params stay f32), optax adamw."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

BATCH, DIM, HIDDEN, OUT = 64, 128, 512, 128


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(HIDDEN, dtype=jnp.bfloat16)(x)  # <up>
    h = nn.relu(h)  # <relu>
    h = nn.Dense(HIDDEN, dtype=jnp.bfloat16)(h)  # <mid>
    h = nn.relu(h)  # <relu2>
    return nn.Dense(OUT, dtype=jnp.bfloat16)(h)  # <down>


def train_step(state, x, y):
  def loss_fn(params):
    pred = state.apply_fn({"params": params}, x)  # <apply>
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)  # <loss>
  loss, grads = jax.value_and_grad(loss_fn)(state.params)  # <grad>
  return state.apply_gradients(grads=grads), loss  # <update>


def build():
  model = MLP()
  x = jnp.zeros((BATCH, DIM), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                        tx=optax.adamw(1e-3))
  return jax.jit(train_step), (state, x, jnp.zeros((BATCH, OUT)))
