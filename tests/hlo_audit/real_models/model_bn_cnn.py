"""flax.linen CNN with BatchNorm in train mode (batch_stats mutable), trained
with optax adam, as flax's examples/imagenet writes its train step."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, HW, CH, CLASSES = 16, 16, 3, 10


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Conv(16, (3, 3))(x)  # <conv1>
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)  # <bn1>
    x = nn.relu(x)  # <relu1>
    x = nn.Conv(32, (3, 3), strides=(2, 2))(x)  # <conv2>
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)  # <bn2>
    x = nn.relu(x)  # <relu2>
    x = x.mean(axis=(1, 2))  # <gap>
    return nn.Dense(CLASSES)(x)  # <head>


model = CNN()
tx = optax.adam(1e-3)


def train_step(params, batch_stats, opt_state, x, y):
  def loss_fn(params):
    logits, updates = model.apply({"params": params, "batch_stats": batch_stats},  # <apply>
                                  x, train=True, mutable=["batch_stats"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, updates["batch_stats"]
  (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), new_stats, opt_state, loss


def build():
  x = jnp.zeros((BATCH, HW, HW, CH), jnp.float32)
  variables = model.init(jax.random.key(0), x, train=False)
  params, stats = variables["params"], variables["batch_stats"]
  return jax.jit(train_step), (params, stats, tx.init(params), x,
                               jnp.zeros((BATCH,), jnp.int32))
