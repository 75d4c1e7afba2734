"""flax.linen LSTM over time (nn.RNN scans an nn.OptimizedLSTMCell with
lax.scan), last state into a classifier, trained with optax adam."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, STEPS, FEATURES, HIDDEN, CLASSES = 16, 32, 32, 128, 4


class Classifier(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.RNN(nn.OptimizedLSTMCell(HIDDEN))(x)  # <rnn>
    return nn.Dense(CLASSES)(h[:, -1])  # <head>


model = Classifier()
tx = optax.adam(1e-3)


def train_step(params, opt_state, x, y):
  def loss_fn(params):
    logits = model.apply({"params": params}, x)  # <apply>
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss


def build():
  x = jnp.zeros((BATCH, STEPS, FEATURES), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  return jax.jit(train_step), (params, tx.init(params), x,
                               jnp.zeros((BATCH,), jnp.int32))
