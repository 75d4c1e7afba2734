"""flax.linen MLP classifier, trained with optax adam through a TrainState
(as flax's examples/mnist writes its train step)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

BATCH, FEATURES, HIDDEN, CLASSES = 128, 256, 512, 16


class MLP(nn.Module):
  hidden: int = HIDDEN
  classes: int = CLASSES

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.hidden)(x)  # <dense1>
    x = nn.relu(x)  # <relu1>
    x = nn.Dense(self.hidden)(x)  # <dense2>
    x = nn.gelu(x)  # <gelu2>
    return nn.Dense(self.classes)(x)  # <logits>


def train_step(state, batch):
  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch["x"])  # <apply>
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()  # <loss>
    return loss
  loss, grads = jax.value_and_grad(loss_fn)(state.params)  # <grad>
  state = state.apply_gradients(grads=grads)  # <update>
  return state, loss


def build():
  model = MLP()
  x = jnp.zeros((BATCH, FEATURES), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                        tx=optax.adam(1e-3))
  batch = {"x": x, "y": jnp.zeros((BATCH,), jnp.int32)}
  return jax.jit(train_step), (state, batch)
