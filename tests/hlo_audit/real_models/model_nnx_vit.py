"""flax.nnx small ViT encoder trained with nnx.Optimizer (adamw), jitted the
functional way the nnx docs show (nnx.split / nnx.merge under jax.jit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

BATCH, PATCHES, PATCH_DIM, DIM, HEADS, CLASSES = 8, 16, 48, 64, 4, 10


class Block(nnx.Module):
  def __init__(self, dim, heads, rngs):
    self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim,
                                       decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
    self.fc1 = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.fc2 = nnx.Linear(4 * dim, dim, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.norm1(x))  # <attn>
    h = nnx.gelu(self.fc1(self.norm2(x)))  # <mlp1>
    return x + self.fc2(h)  # <mlp2>


class ViT(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Linear(PATCH_DIM, DIM, rngs=rngs)
    self.pos = nnx.Param(jnp.zeros((1, PATCHES, DIM)))
    self.blocks = nnx.List([Block(DIM, HEADS, rngs)])
    self.norm = nnx.LayerNorm(DIM, rngs=rngs)
    self.head = nnx.Linear(DIM, CLASSES, rngs=rngs)

  def __call__(self, x):
    x = self.embed(x) + self.pos  # <embed>
    for block in self.blocks:
      x = block(x)  # <block>
    x = self.norm(x).mean(axis=1)  # <pool>
    return self.head(x)  # <head>


def loss_fn(model, x, y):
  logits = model(x)  # <forward>
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def build():
  model = ViT(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  def train_step(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)  # <grad>
    optimizer.update(model, grads)  # <update>
    return nnx.state((model, optimizer)), loss

  x = jnp.zeros((BATCH, PATCHES, PATCH_DIM), jnp.float32)
  y = jnp.zeros((BATCH,), jnp.int32)
  return jax.jit(train_step), (state, x, y)
