"""flax.linen residual MLP stack as nn.scan over nn.remat'd layers (the
pattern of flax's "scan over layers" guide), SGD with momentum from optax."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, DIM, LAYERS = 64, 128, 4


class Layer(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    h = nn.Dense(DIM)(x)  # <layer_dense>
    x = x + jnp.tanh(h)  # <layer_act>
    return x, None


class Stack(nn.Module):
  @nn.compact
  def __call__(self, x):
    ScanLayer = nn.scan(nn.remat(Layer), variable_axes={"params": 0},  # <scan>
                        split_rngs={"params": True}, length=LAYERS)
    x, _ = ScanLayer()(x, None)  # <stack>
    return nn.Dense(1)(x)  # <out>


model = Stack()
tx = optax.sgd(1e-2, momentum=0.9)


def train_step(params, opt_state, x, y):
  def loss_fn(params):
    pred = model.apply({"params": params}, x)  # <apply>
    return jnp.mean((pred - y) ** 2)
  loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss  # <apply_updates>


def build():
  x = jnp.zeros((BATCH, DIM), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  return jax.jit(train_step), (params, tx.init(params), x, jnp.zeros((BATCH, 1)))
