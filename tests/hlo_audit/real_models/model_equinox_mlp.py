"""equinox MLP regression trained with optax (as equinox's "train a CNN"
example writes it: eqx.filter_value_and_grad, optax update, eqx.apply_updates,
everything under eqx.filter_jit)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

BATCH, IN, WIDTH, OUT = 256, 64, 256, 8


class Model(eqx.Module):
  mlp: eqx.nn.MLP
  norm: eqx.nn.LayerNorm

  def __init__(self, key):
    self.norm = eqx.nn.LayerNorm(IN)
    self.mlp = eqx.nn.MLP(IN, OUT, WIDTH, depth=3, activation=jax.nn.silu, key=key)

  def __call__(self, x):
    return self.mlp(self.norm(x))  # <call>


@eqx.filter_value_and_grad
def compute_loss(model, x, y):
  pred = jax.vmap(model)(x)  # <vmap>
  return jnp.mean((pred - y) ** 2)  # <mse>


optim = optax.adam(3e-4)


@eqx.filter_jit
def make_step(model, opt_state, x, y):
  loss, grads = compute_loss(model, x, y)  # <grad>
  updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))  # <optax>
  model = eqx.apply_updates(model, updates)  # <apply>
  return model, opt_state, loss


def build():
  model = Model(jax.random.key(0))
  opt_state = optim.init(eqx.filter(model, eqx.is_array))
  x = jnp.zeros((BATCH, IN), jnp.float32)
  y = jnp.zeros((BATCH, OUT), jnp.float32)
  # eqx.filter_jit's own lowering; `.lowered` is the jax stage underneath.
  return make_step.lower(model, opt_state, x, y).lowered, ()
